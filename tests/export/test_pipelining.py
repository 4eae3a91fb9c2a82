"""Pipeline stages across processes (torch.distributed.pipelining, gloo on CPU): one step of a
staged strategy gives the single-process loss and gradients, GPipe and 1F1B, with memory
policies inside the stages; the rules that refuse a strategy name the unit."""
import copy

import pytest
import torch
import torch.nn.functional as F

import memflow
from memflow import zoo
from memflow.errors import ExportError
from memflow.export import apply, held_bytes
from memflow.export.pipelining import build_pipeline, split_points, stage_modules, stage_ranks
from memflow.strategy import Strategy

from gloo_ranks import gathered, run_ranks

GPT2 = dict(n_layer=2, hidden=16, n_head=2, vocab=40, seq_len=6, dropout=0.0)
RESNET = dict(num_classes=5, width=4, image_size=32, blocks=(1, 2, 1, 1))


def mse(output, target):
    return F.mse_loss(output.float(), target)


def _inputs(name, batch, options):
    model, inputs = zoo.get(name, batch, device="cpu", seed=0, **options)
    return model, inputs if isinstance(inputs, tuple) else (inputs,)


def _worker(rank, name, options, batch, doc, target, replicas):
    """Both schedules on this rank: {schedule: (loss or None, {name: grad})}."""
    model, args = _inputs(name, batch, options)
    share = batch // replicas
    replica = rank // (torch.distributed.get_world_size() // replicas)
    args = tuple(a[replica * share:(replica + 1) * share] for a in args)
    target = target[replica * share:(replica + 1) * share]
    out = {}
    for schedule in ("gpipe", "1f1b"):
        s = Strategy.from_dict(doc).with_schedule(schedule=schedule)
        run = build_pipeline(model, s, (args, {}), rank=rank, loss_fn=mse)
        loss = run.step(args, {}, target)
        out[schedule] = (loss, {n: p.grad.clone() for n, p in run.module.named_parameters()})
        model.zero_grad(set_to_none=True)
    return out


def _reference(name, options, batch, strategy):
    """Loss and gradients of the single-process original: ``apply`` runs the same
    micro-batches (GPipe in one process) and memory policies."""
    model, args = _inputs(name, batch, options)
    one = Strategy(strategy.units, devices=[("gpu0",)] * len(strategy), policy=strategy.policy,
                   microbatches=strategy.microbatches, schedule="gpipe")
    exported = apply(model, one, devices={"gpu0": "cpu"})
    out = exported(*args)
    torch.manual_seed(1)
    target = torch.randn(out.shape)
    loss = mse(out, target)
    loss.backward()
    return loss.detach(), target, {n.removeprefix("module."): p.grad
                                   for n, p in exported.named_parameters()}


@pytest.mark.slow       # spawns 2 processes (each imports torch and memflow)
@pytest.mark.parametrize("name, options, policies", [
    ("gpt2", GPT2, {"recompute": ["wte", "wpe", "<root>#2"], "offload": ["ln_f"]}),
    ("resnet50", RESNET, {"recompute": ["layer1.0", "layer2.0"], "offload": ["fc"]}),
])
def test_two_stages_match_one_process(name, options, policies, tmp_path):
    batch = 4
    graph = memflow.zoo.graph(name, batch_size=batch, units="blocks", **options)
    s = Strategy.pipeline(graph, 2, stages=2, microbatches=2).with_policy(**policies)
    loss, target, reference = _reference(name, options, batch, s)
    ranks = run_ranks(_worker, 2, tmp_path, name, options, batch, s.to_dict(), target, 1)
    for schedule in ("gpipe", "1f1b"):
        assert ranks[0][schedule][0] is None            # the loss lives on the last stage
        torch.testing.assert_close(ranks[1][schedule][0], loss, rtol=1e-5, atol=1e-6)
        grads = gathered([r[schedule][1] for r in ranks], _inputs(name, batch, options)[0])
        assert grads.keys() == reference.keys(), schedule
        for n in reference:
            torch.testing.assert_close(grads[n], reference[n], rtol=1e-4, atol=1e-6,
                                       msg=f"{schedule} {n}")


@pytest.mark.slow       # spawns 4 processes
def test_replicas_of_a_pipeline_average_their_gradients(tmp_path):
    options, batch = {"n": 4, "width": 16, "kind": "residual"}, 8
    graph = memflow.zoo.graph("chain", batch_size=batch, units="blocks", **options)
    s = Strategy.pipeline(graph, 4, stages=2, microbatches=2, dp=2).with_policy(
        recompute=graph.names[:1])
    assert stage_ranks(s) == {"gpu0": 0, "gpu1": 1, "gpu2": 2, "gpu3": 3}
    loss, target, reference = _reference("chain", options, batch, s)
    ranks = run_ranks(_worker, 4, tmp_path, "chain", options, batch, s.to_dict(), target, 2)
    for schedule in ("gpipe", "1f1b"):
        losses = [r[schedule][0] for r in ranks if r[schedule][0] is not None]
        torch.testing.assert_close(torch.stack(losses).mean(), loss, rtol=1e-5, atol=1e-6)
        for r in ranks:                 # every replica holds the averaged gradients
            for n, g in r[schedule][1].items():
                torch.testing.assert_close(g, reference[n.removeprefix("module.")],
                                           rtol=1e-4, atol=1e-6, msg=f"{schedule} {n}")


def test_stages_chain_to_the_model_and_run_their_memory_policies():
    graph = memflow.zoo.graph("gpt2", batch_size=4, units="blocks", **GPT2)
    s = Strategy.pipeline(graph, 2, stages=2, microbatches=2)
    model, args = _inputs("gpt2", 4, GPT2)
    kept, tied = stage_modules(model, s, (args, {}))
    assert tied == [{"submod_pp_0": "wte.weight", "submod_pp_1": "lm_head.weight"}]
    micro = args[0][:2]
    torch.testing.assert_close(kept[1](kept[0](micro)), model(micro))
    recomputed, _ = stage_modules(model, s.with_policy(recompute=["h.0"]), (args, {}))
    assert held_bytes(recomputed[0], micro)["cpu"] < held_bytes(kept[0], micro)["cpu"]


def test_cuts_fall_at_module_calls():
    graph = memflow.zoo.graph("gpt2", batch_size=2, units="blocks", **GPT2)
    s = Strategy.pipeline(graph, 2, stages=2, microbatches=2)
    assert split_points(s, graph) == {"h.1": "beginning"}
    glue = s.with_config({"<root>#2": {"stage": 1}, "h.0": {"stage": 1}})
    assert split_points(glue, graph) == {"wpe": "end"}
    units = ["<root>", "a", "<root>#2", "<root>#3"]
    inside = Strategy(units, devices=[("gpu0",)] * 3 + [("gpu1",)], stage=[0, 0, 0, 1])
    with pytest.raises(ExportError, match="unit '<root>#3' starts stage 1 after unit "
                                          "'<root>#2', but neither is a module called once"):
        split_points(inside)


def test_a_stage_on_two_devices_or_split_is_refused():
    units = ["a", "b"]
    shared = Strategy(units, devices=[("gpu0",), ("gpu0",)], stage=[0, 1])
    with pytest.raises(ExportError, match="unit 'b': device 'gpu0' runs stage 1 of replica 0"):
        stage_ranks(shared)
    split = Strategy(units, devices=[("gpu0",), ("gpu1", "gpu2")], parameter=[1, 2],
                     stage=[0, 1])
    with pytest.raises(ExportError, match="unit 'b' is split over its parameter"):
        stage_ranks(split)


def test_micro_batches_must_divide_the_batch():
    model, args = _inputs("chain", 6, {"n": 2, "width": 8})
    s = Strategy(["layers.0", "layers.1"], devices=[("gpu0",), ("gpu1",)], stage=[0, 1],
                 microbatches=4)
    with pytest.raises(ExportError, match="4 micro-batches do not divide the replica's batch "
                                          "of 6"):
        build_pipeline(copy.deepcopy(model), s, (args, {}), rank=0, loss_fn=mse)
