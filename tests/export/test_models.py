"""Every small zoo model and the foundation's varied real models, with keep / recompute /
offload mixed over their units: the exported model's gradients equal the original's bit for
bit, and the bytes it holds for backward are what the memory model predicts."""
import pytest
import torch

from memflow import zoo
from memflow.export import apply, validate

from models import captured, grads, mismatches, mixed, real_cases

MODELS = zoo.names() + sorted(real_cases())


@pytest.mark.parametrize("name", MODELS)
def test_mixed_policies_keep_gradients_and_predicted_memory(name):
    model, inputs, graph = captured(name)
    strategy = mixed(graph, seed=0)
    assert {"recompute", "offload"} <= set(strategy.policies) or len(graph) < 4
    exported = apply(model, strategy, graph)
    assert mismatches(grads(model, inputs), grads(exported, inputs)) == []
    table = validate(model, inputs, strategy, graph)
    assert table.loc["saved_bytes", "predicted"] > 0
    assert abs(table.loc["saved_bytes", "error"]) <= 0.01
    assert abs(table.loc["offloaded_bytes", "measured"]
               - table.loc["offloaded_bytes", "predicted"]) <= 0.01 * table.loc[
        "saved_bytes", "predicted"]


@pytest.mark.parametrize("name", ["gpt2", "resnet50", "hf-bert", "lstm", "branching"])
@pytest.mark.parametrize("policy", ["recompute", "offload"])
def test_one_policy_everywhere(name, policy):
    # Everything recomputed is one segment from the first unit to the last; everything
    # offloaded leaves only segment-free, host-side storage.
    model, inputs, graph = captured(name)
    strategy = mixed(graph, policies=(policy,))
    exported = apply(model, strategy, graph)
    assert mismatches(grads(model, inputs), grads(exported, inputs)) == []
    table = validate(model, inputs, strategy, graph)
    assert abs(table.loc["saved_bytes", "error"]) <= 0.01


@pytest.mark.parametrize("name", ["gpt2", "resnet50", "chain", "hf-gpt2"])
def test_block_units(name):
    model, inputs, graph = captured(name, "blocks")
    strategy = mixed(graph, seed=3)
    exported = apply(model, strategy, graph)
    assert mismatches(grads(model, inputs), grads(exported, inputs)) == []
    assert abs(validate(model, inputs, strategy, graph).loc["saved_bytes", "error"]) <= 0.01


def test_keep_everything_is_the_plain_model():
    model, inputs, graph = captured("gpt2")
    table = validate(model, inputs, mixed(graph, policies=("keep",)), graph)
    assert table.loc["saved_bytes", "predicted"] == graph.units["saved_bytes"].sum()
    assert table.loc["saved_bytes", "measured"] == graph.units["saved_bytes"].sum()
    assert table.loc["offloaded_bytes", "measured"] == 0


def test_graph_is_optional():
    # Without the graph, glue units are told from module units by their names.
    model, inputs, graph = captured("gpt2")
    strategy = mixed(graph, seed=1)
    assert mismatches(grads(model, inputs), grads(apply(model, strategy), inputs)) == []
    assert validate(model, inputs, strategy).loc["saved_bytes", "error"] == 0


def test_recompute_saves_memory_and_dropout_replays_the_same_mask():
    model, inputs, graph = captured("gpt2")
    strategy = mixed(graph, policies=("recompute",))
    table = validate(model, inputs, strategy, graph)
    assert table.loc["saved_bytes", "measured"] < 0.2 * graph.units["saved_bytes"].sum()
    exported = apply(model, strategy, graph)
    assert mismatches(grads(model, inputs, seed=5), grads(exported, inputs, seed=5)) == []
    assert mismatches(grads(model, inputs, seed=5), grads(exported, inputs, seed=6)) != []


def test_original_model_is_left_alone_and_inplace_wraps_it():
    model, inputs, graph = captured("chain")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    strategy = mixed(graph, seed=2)
    exported = apply(model, strategy, graph)
    assert exported.module is not model and not model._forward_pre_hooks
    same = apply(model, strategy, graph, inplace=True)
    assert same.module is model
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert same.remove() is model
    assert not any(m._forward_pre_hooks for m in model.modules())


def test_recompute_updates_batch_norm_statistics_once():
    # Replay writes running statistics into a scratch copy: one step moves them once, as in
    # the original model (torch.utils.checkpoint's own recomputation moves them twice).
    model, inputs, graph = captured("resnet50")
    exported = apply(model, mixed(graph, policies=("recompute",)), graph)
    grads(model, inputs)
    grads(exported, inputs)
    ours = dict(exported.module.named_buffers())
    for name, buffer in model.named_buffers():
        assert torch.equal(buffer, ours[name]), name


@pytest.mark.parametrize("name", ["gpt2", "resnet50", "lstm"])
def test_compress_in_a_mix_moves_gradients_by_the_bound_only(name):
    model, inputs, graph = captured(name)
    strategy = mixed(graph, seed=4, policies=("keep", "recompute", "offload", "compress:1e-4"))
    strategy = strategy.with_policy({graph.names[1]: "compress:1e-4"})
    reference, got = grads(model, inputs), grads(apply(model, strategy, graph), inputs)
    scale = max(g.abs().max() for g in reference.values())
    assert mismatches(reference, got, atol=1e-2 * scale) == []
