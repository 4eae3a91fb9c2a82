"""``selective`` exported as PyTorch's selective activation checkpointing: each selective unit
a non-reentrant checkpoint whose ``context_fn`` must save the expensive ops' outputs and
prefers to recompute the rest. Gradients equal the original's bit for bit, and the bytes held
for backward are the memory model's to the byte."""
import pytest
import torch

import memflow

from torch import nn

from memflow import zoo
from memflow.errors import ExportError
from memflow.export import apply, validate
from memflow.strategy import Strategy
from memflow.export.selective import selective_policy
from torch.utils.checkpoint import CheckpointPolicy

from memflow.planners import selective_plan
from models import _capture_models, captured, grads, mismatches, mixed


def _check(name, units, policies):
    model, inputs, graph = captured(name, units)
    strategy = mixed(graph, seed=1, policies=policies)
    exported = apply(model, strategy, graph)
    assert mismatches(grads(model, inputs), grads(exported, inputs)) == []
    table = validate(model, inputs, strategy, graph)
    assert abs(table.loc["saved_bytes", "error"]) <= 0.01
    return table.loc["saved_bytes", "measured"], graph


@pytest.mark.parametrize("name", zoo.names() + ["hf-bert"])
def test_selective_in_a_mix_keeps_gradients_and_predicted_memory(name):
    _check(name, "leaves", ("keep", "selective", "recompute"))


@pytest.mark.parametrize("name", ["gpt2", "resnet50"])
def test_selective_everywhere_holds_less_than_keep(name):
    # (Linear + ReLU stacks hold more: ReLU saves its output, selective the Linear's too.)
    held, graph = _check(name, "blocks", ("selective",))
    assert 0 < held < graph.units["saved_bytes"].sum()


def test_a_hugging_face_llama_holds_what_the_model_predicts():
    # GQA attention, RoPE, RMSNorm, SwiGLU from transformers' own code: each decoder layer
    # selective, and the per-op plan on leaf units at 60% of keep-all
    torch.manual_seed(0)
    model, inputs, _ = _capture_models("hf_models").HF_MODELS["llama"]()
    blocks = memflow.from_torch(model, inputs, units="blocks")
    leaves = memflow.from_torch(model, inputs)
    layers = [u for u in blocks.names if ".layers." in u]
    for graph, strategy in ((blocks, Strategy.single_device(blocks).with_policy(
            {u: "selective" for u in layers})), (leaves, selective_plan(leaves, 0.6))):
        assert "selective" in strategy.policies
        exported = apply(model, strategy, graph)
        assert mismatches(grads(model, inputs), grads(exported, inputs)) == []
        assert abs(validate(model, inputs, strategy, graph).loc["saved_bytes", "error"]) <= 0.01


def test_the_policy_saves_matmuls_and_convolutions_only():
    policy = selective_policy()
    aten = torch.ops.aten
    assert [policy(None, f) for f in (aten.mm.default, aten.convolution.default,
                                      aten.gelu.default, aten.native_layer_norm.default)] == [
        CheckpointPolicy.MUST_SAVE, CheckpointPolicy.MUST_SAVE,
        CheckpointPolicy.PREFER_RECOMPUTE, CheckpointPolicy.PREFER_RECOMPUTE]
    assert selective_policy({"gelu"})(None, aten.gelu.default) == CheckpointPolicy.MUST_SAVE


class _Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return torch.tanh(self.fc(x).mul_(2.0))


def test_a_non_idempotent_write_to_a_saved_output_is_refused():
    # mul_ writes the Linear's output, which the selective checkpoint saves: recompute would
    # read the doubled value
    model = nn.Sequential(_Scaled())
    s = Strategy(["0"], devices=[("gpu0",)]).with_policy({"0": "selective"})
    with pytest.raises(ExportError, match="mul_ writes in place the output of an expensive op"):
        apply(model, s)(torch.randn(4, 8)).sum().backward()


def test_megatron_selective_recompute_of_the_attention_core_exports():
    model, inputs, graph = captured("gpt2")
    core = [n for n in graph.names if n.endswith((".attn", ".attn.attn_dropout"))
            or ".attn#" in n]
    strategy = Strategy.single_device(graph).with_policy({n: "recompute" for n in core})
    assert len(set(strategy.segment[strategy.segment >= 0])) == 2     # one per layer
    exported = apply(model, strategy, graph)
    assert mismatches(grads(model, inputs), grads(exported, inputs)) == []
    assert abs(validate(model, inputs, strategy, graph).loc["saved_bytes", "error"]) <= 0.01
