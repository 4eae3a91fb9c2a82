"""Property tests over random graphs and strategies: the ledger and the schedule are sound."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from memflow.sim import Simulator

from .graphs import cluster, graphs, strategies_for

CLUSTER = cluster("2x4xV100-16GB")
DEVICES = list(CLUSTER.devices.index)


@st.composite
def cases(draw):
    g = draw(graphs())
    return g, draw(strategies_for(g, DEVICES))


def _check(run) -> None:
    L, H = run.device, run.host
    eps = 1e-6
    # memory never negative, everything but the persistent part freed at the end
    assert (L.total - L.persistent.sum(1)[L.cls] >= -eps).all()
    assert np.allclose(L.final, 0.0, atol=1e-6)
    assert (H.total >= -eps).all() and np.allclose(H.final, 0.0, atol=1e-6)
    start, end, dur = run.start, run.end, run.duration
    # no task starts before its inputs
    for i, deps in enumerate(run.tasks.deps):
        for d in deps:
            ready = end[d] if d >= 0 else start[-d - 1]
            assert start[i] >= ready - 1e-12
    # no two tasks overlap on a channel
    by_channel: dict[int, list[int]] = {}
    for i, chans in enumerate(run.task_channels):
        for c in chans:
            by_channel.setdefault(c, []).append(i)
    busy = 0.0
    for tasks in by_channel.values():
        tasks = sorted(tasks, key=lambda i: (start[i], end[i]))
        s, e = start[tasks], end[tasks]
        assert (s[1:] >= e[:-1] - 1e-12).all()
        busy = max(busy, float(dur[tasks].sum()))
    # iteration time >= critical path and >= every channel's busy time
    longest = np.zeros(len(dur))
    for i, deps in enumerate(run.tasks.deps):
        before = [longest[d] if d >= 0 else longest[-d - 1] - dur[-d - 1] for d in deps]
        longest[i] = max(before, default=0.0) + dur[i]
    assert run.iteration_time >= longest.max(initial=0.0) - 1e-12
    assert run.iteration_time >= busy - 1e-12


@settings(max_examples=100)
@given(cases())
def test_ledger_and_schedule_are_sound(case):
    g, s = case
    s.validate(g, CLUSTER)
    for opt in ("sgd",):
        _check(Simulator(g, CLUSTER, optimizer=opt).run(s))


@settings(max_examples=40)
@given(cases(), st.sampled_from(["sgd", "adam"]))
def test_folding_changes_nothing(case, optimizer):
    g, s = case
    sim = Simulator(g, CLUSTER, optimizer=optimizer)
    a, b = sim.run(s, fold=True), sim.run(s, fold=False)
    assert np.array_equal(a.start, b.start) and np.array_equal(a.end, b.end)
    pa = a.device.peak[a.device_class]
    pb = b.device.peak[b.device_class]
    assert np.allclose(pa, pb)
    assert np.allclose(a.host.peak, b.host.peak)
