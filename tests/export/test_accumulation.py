"""Gradient accumulation (issue 14 item 1, issue 12 item 6): 1F1B with one stage runs each
micro-batch's forward, then its backward. One step gives the full batch's loss and gradients,
holds one micro-batch's activations as the simulator predicts, and the search keeps such
seeds as they are."""
import importlib.util

import pytest
import torch
import torch.nn.functional as F
from torch.utils import _pytree as pytree

import memflow
from memflow.export import apply, script, validate
from memflow.export.accumulation import accumulate, accumulates
from memflow.export.validation import predicted_held
from memflow.search.space import SearchSpace
from memflow.strategy import Strategy
from memflow.strategy.runnable import unrunnable

from models import mismatches, zoo_small

BATCH = 4


def _case(name):
    torch.manual_seed(0)
    model, inputs = memflow.zoo.get(name, batch_size=BATCH, device="cpu", **zoo_small(name))
    model.eval()        # no dropout: the two steps compare exactly
    graph = memflow.from_torch(model, inputs, units="blocks")
    s = Strategy.single_device(graph).with_policy(recompute=graph.names[1:3],
                                                  offload=graph.names[3:4])
    return model, inputs, graph, s


def _first(out):
    return next(t for t in pytree.tree_leaves(out) if torch.is_tensor(t) and t.is_floating_point())


def _step(model, inputs, m, target):
    """(loss, gradients) of one step of ``m`` accumulated micro-batches (m=1: the batch)."""
    call = (inputs, {}) if isinstance(inputs, tuple) else ((inputs,), {})
    loss = accumulate(model, call, m, lambda out, k: F.mse_loss(_first(out),
                                                                target.tensor_split(m)[k]))
    grads = {n.removeprefix("module."): p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return float(loss), grads


@pytest.mark.parametrize("name", ["chain", "gpt2"])
def test_accumulated_steps_are_the_full_batch_step(name):
    model, inputs, graph, s = _case(name)
    call = inputs if isinstance(inputs, tuple) else (inputs,)
    target = torch.randn(_first(model(*call)).shape)
    loss, grads = _step(model, inputs, 1, target)
    for m in (2, 4):
        local = s.with_schedule(microbatches=m, schedule="1f1b")
        assert accumulates(local) and unrunnable(local, graph) is None
        exported = apply(model, local, graph)
        got_loss, got = _step(exported, inputs, m, target)
        assert got_loss == pytest.approx(loss, rel=1e-5)
        assert mismatches(grads, got, atol=1e-6, rtol=1e-5) == []


def test_held_bytes_are_one_micro_batch_as_predicted():
    model, inputs, graph, s = _case("chain")
    gpipe = s.with_schedule(microbatches=2, schedule="gpipe")
    accum = s.with_schedule(microbatches=2, schedule="1f1b")
    held, all_held = predicted_held(graph, accum), predicted_held(graph, gpipe)
    assert held["gpu0"] == pytest.approx(all_held["gpu0"] / 2)
    rows = validate(model, inputs, accum, graph, devices={"gpu0": "cpu"})
    assert abs(rows.loc["saved_bytes", "error"]) <= 0.01
    assert abs(rows.loc["offloaded_bytes", "error"]) <= 0.01


def test_the_script_accumulates_as_it_trains_the_full_batch(tmp_path):
    g = memflow.zoo.graph("chain", batch_size=8, units="blocks", n=3, width=16)
    s = Strategy.single_device(g).with_policy(recompute=g.names[:2])
    losses = []
    for m in (1, 2, 4):
        path = script(s.with_schedule(microbatches=m, schedule="1f1b"),
                      tmp_path / f"m{m}" / "train.py", model="chain",
                      model_options={"n": 3, "width": 16}, batch_size=8, optimizer="adam")
        spec = importlib.util.spec_from_file_location(f"accumulating{m}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        losses.append(module.main(["--steps", "3"]))
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)
    assert losses[2] == pytest.approx(losses[0], rel=1e-5)


def test_the_search_keeps_gradient_accumulation_seeds():
    """Projection into the export space used to switch such seeds to GPipe, which holds all
    micro-batches (benchmarks/bench_sharding.py: 10.47 s against the seed's 7.80 s)."""
    g = memflow.zoo.graph("chain", batch_size=8, units="blocks", n=3, width=16)
    space = SearchSpace(g, memflow.Cluster.preset("4xV100-16GB"))
    seed = Strategy.data_parallel(g, 4).with_schedule(microbatches=2, schedule="1f1b")
    assert space.project(seed) == seed
