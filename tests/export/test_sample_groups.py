"""Per-unit sample degrees across processes (gloo on CPU): one step of a strategy whose units
have different data-parallel degrees gives the single-process loss and gradients, on an MLP, a
CNN and a transformer, with memory policies inside the groups; what is not composed yet is
refused naming the unit. One spawn of 4 processes runs every case (each launch costs seconds)."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import memflow
from memflow import zoo
from memflow.errors import ExportError
from memflow.export.multiprocess import across_processes, processes
from memflow.export.sample_groups import GroupRun, group_ranks, groups
from memflow.strategy import Strategy
from memflow.strategy.runnable import sample_groups, unrunnable

from gloo_ranks import gathered, run_ranks

BATCH = 8
DEVICES = ("gpu0", "gpu1", "gpu2", "gpu3")
MODELS = {
    "mlp": dict(in_features=12, width=16, n_layer=3, num_classes=5),
    "alexnet": dict(num_classes=5, hidden=16, image_size=64, dropout=0.0),
    "gpt2": dict(n_layer=2, hidden=16, n_head=2, vocab=40, seq_len=6, dropout=0.0),
}


def _mixed(name):
    """The MLP: degrees 4, then 2 on (gpu0, gpu2), then 1 on gpu1 (devices follow the
    tuples); the others (a trace per share costs seconds): 4, then 2 on (gpu1, gpu3). With
    recompute and offload in the groups; the loss unit keeps the group before it."""
    g = zoo.graph(name, batch_size=BATCH, units="blocks", **MODELS[name])
    n = len(g.names)
    cuts, tuples = (((n // 3, 2 * n // 3), (DEVICES, ("gpu0", "gpu2"), ("gpu1",)))
                    if name == "mlp" else ((n // 2,), (DEVICES, ("gpu1", "gpu3"))))
    config = {}
    for i, u in enumerate(g.names):
        devices = tuples[sum(i >= c for c in cuts)]
        config[u] = {"sample": len(devices), "devices": list(devices)}
    s = Strategy.single_device(g).with_config(config).with_policy(
        recompute=[g.names[0], g.names[cuts[-1]]], offload=[g.names[max(1, cuts[0] // 2)]])
    return g, s


def _inputs(name):
    model, inputs = zoo.get(name, BATCH, device="cpu", seed=0, **MODELS[name])
    return model, inputs if isinstance(inputs, tuple) else (inputs,)


def _target(model, args):
    out = model(*args)
    return torch.randn(out.shape, generator=torch.Generator().manual_seed(1))


def mse(output, target):
    return F.mse_loss(output.float(), target)


def _worker(rank, cases):
    out = {}
    for name, doc, target in cases:
        model, args = _inputs(name)
        run = GroupRun(model, Strategy.from_dict(doc), (args, {}), rank=rank)
        loss = run.step(args, {}, target, mse)
        out[name] = (loss, {n: p.grad.clone() for n, p in run.module.named_parameters()})
    return out


@pytest.mark.slow       # spawns 4 processes once, for every model
def test_mixed_degrees_match_one_process(tmp_path):
    cases, references = [], {}
    for name in MODELS:
        g, s = _mixed(name)
        assert unrunnable(s, g) is None and across_processes(s) == "sample"
        assert processes(s, "sample") == 4
        model, args = _inputs(name)
        target = _target(model, args)
        loss = mse(model(*args), target)
        loss.backward()
        references[name] = (loss.detach(), {n: p.grad for n, p in model.named_parameters()})
        cases.append((name, s.to_dict(), target))
    ranks = run_ranks(_worker, 4, tmp_path, cases)
    for name, (loss, reference) in references.items():
        for r in ranks:
            torch.testing.assert_close(r[name][0], loss, rtol=1e-5, atol=1e-6)
        names = {}
        for r in ranks:     # a group's module names its parameters "<group>.module.<path>"
            names.update({n: n.split(".", 1)[1].removeprefix("module.") for n in r[name][1]})
        grads = gathered([{names[n]: g for n, g in r[name][1].items()} for r in ranks],
                         _inputs(name)[0])
        assert grads.keys() == reference.keys(), name
        for n, grad in grads.items():
            torch.testing.assert_close(grad, reference[n], rtol=1e-4, atol=1e-5, msg=n)


def test_groups_follow_the_devices():
    s = Strategy(["a", "b", "c", "<loss>"], devices=[("gpu2", "gpu3"), ("gpu2", "gpu3"),
                                                     ("gpu3",), ("gpu3",)], sample=[2, 2, 1, 1])
    assert group_ranks(s) == {"gpu2": 0, "gpu3": 1}
    assert [x.ranks for x in groups(s)] == [(0, 1), (1,)]
    assert sample_groups(s).tolist() == [0, 0, 1, 1]


@pytest.mark.parametrize("change, message", [
    (lambda s, u: s.with_schedule(microbatches=2, schedule="gpipe"), "2 micro-batches"),
    (lambda s, u: s.with_config(u[-2], parameter=2, devices=["gpu1", "gpu3"]),
     "has a parameter split"),
    (lambda s, u: s.with_shard("parameters"), "shards its model states"),
])
def test_what_is_not_composed_is_refused(change, message):
    g, s = _mixed("mlp")
    reason = unrunnable(change(s, g.names), g)
    assert reason is not None and message in reason and "sample degree" in reason


def test_a_group_boundary_inside_a_module_is_refused():
    g = zoo.graph("gpt2", batch_size=BATCH, **MODELS["gpt2"])
    names = list(g.names)
    glue = next(i for i, u in enumerate(names) if u.startswith("<root>") and i > 0)
    s = Strategy.single_device(g).with_config(
        {u: {"sample": 2, "devices": ["gpu0", "gpu1"]} for u in names[:glue]})
    reason = unrunnable(s, g)
    assert reason is None or "cannot be cut there" in reason
