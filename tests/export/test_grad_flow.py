"""A pipeline stage receives what the model computes without grad (Llama's rotary cos and sin)
as the model has it: detached on entry, so it holds for backward what the memory model
predicts, and the gradients are the model's (in one process: no launch)."""
import copy

import torch

from memflow import zoo
from memflow.export import held_bytes
from memflow.export.pipelining import stage_modules
from memflow.export.validation import predicted_held
from memflow.strategy import Strategy

LLAMA = dict(vocab=40, hidden=16, n_layer=2, n_head=4, n_kv_head=2, ffn=24, seq_len=6)


def test_the_second_stage_of_a_llama_holds_what_is_predicted_and_the_models_gradients():
    batch, m = 4, 2
    g = zoo.graph("tinyllama-1.1b", batch_size=batch, units="blocks", **LLAMA)
    s = Strategy.pipeline(g, 2, stages=2, microbatches=m, schedule="gpipe")
    model, (ids,) = zoo.get("tinyllama-1.1b", batch, device="cpu", **LLAMA)
    reference = copy.deepcopy(model)
    stages, _ = stage_modules(model, s, ((ids,), {}))
    micro = ids[:batch // m]
    sent = stages[0](micro)
    assert [t.requires_grad for t in sent] == [True, False, False]     # x, cos, sin
    # as PipelineStage receives them: every floating value requires grad
    received = tuple(t.detach().requires_grad_(t.is_floating_point()) for t in sent)
    # the memory model holds every micro-batch; before, stage 1 held 2,304 bytes more here (q,
    # k and their rotated halves, saved for the gradient of cos and sin)
    assert held_bytes(stages[1], received) == {"cpu": predicted_held(g, s)["gpu1"] / m}

    out = stages[1](*received)
    out.float().pow(2).mean().backward()
    assert [t.grad is None for t in received] == [False, True, True]
    torch.autograd.backward(sent[0], received[0].grad)
    reference(micro).float().pow(2).mean().backward()
    grads = {n.removeprefix("module."): p.grad for stage in stages
             for n, p in stage.named_parameters()}
    want = dict(reference.named_parameters())
    assert grads.keys() == want.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, want[name].grad, msg=name)
