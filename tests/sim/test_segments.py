"""Adjacent recompute segments (segment breaks) in the memory model and the simulator.

Hand-checked on ``chain(params=100)``: u_i saves its input (100, 200, 300 bytes) and an internal
tensor (10, 20, 30); the output is 50 bytes; each unit has 100 bytes of parameters (with 400 the
step's peak is at the end of backward, weights and all parameter gradients, for any schedule).
"""
import pytest

from memflow.sim import simulate
from memflow.strategy import Strategy

from .graphs import chain, cluster

V100 = cluster("1xV100-16GB")


def _runs():
    g = chain(params=100)
    one = Strategy.single_device(g).with_policy(recompute=list(g.names))
    return g, one, one.with_segments("each")


def test_three_segments_hold_less_at_peak_than_one():
    g, one, each = _runs()
    assert one.segment.tolist() == [0, 0, 0] and each.segment.tolist() == [0, 1, 2]
    r_one, r_each = simulate(g, one, V100), simulate(g, each, V100)
    # one segment: its input 100 held (the output 50 is freed after the loss), then everything
    # re-run at once: 10 + 200 + 20 + 300 + 30 + 50 — the activations of keeping all
    assert r_one.memory["activations"].max() == 100 + 10 + 200 + 20 + 300 + 30 + 50
    # three segments: every unit's input held (100 + 200 + 300); u2's re-run adds 30 + 50;
    # u0's and u1's internals (10 + 20) are never resident together with them
    assert r_each.memory["activations"].max() == 100 + 200 + 300 + 30 + 50
    # the total peak comes later (gradients, backward transients), where the gap is smaller
    assert r_each.peak_memory["gpu0"] < r_one.peak_memory["gpu0"]


def test_each_segment_is_recomputed_just_before_its_units_backward():
    g, one, each = _runs()
    tl = simulate(g, each, V100).timeline
    steps = [(k, u) for k, u in zip(tl["kind"], tl["unit"]) if k in ("recompute", "backward")]
    assert steps == [("recompute", "u2"), ("backward", "u2"), ("recompute", "u1"),
                     ("backward", "u1"), ("recompute", "u0"), ("backward", "u0")]
    tl = simulate(g, one, V100).timeline
    steps = [(k, u) for k, u in zip(tl["kind"], tl["unit"]) if k in ("recompute", "backward")]
    assert steps[:3] == [("recompute", "u0"), ("recompute", "u1"), ("recompute", "u2")]


@pytest.mark.parametrize("breaks", [["u1"], ["u2"]])
def test_a_break_splits_the_run_where_it_is(breaks):
    g, one, _ = _runs()
    s = one.with_segments(breaks)
    tl = simulate(g, s, V100).timeline
    order = [(k, u) for k, u in zip(tl["kind"], tl["unit"]) if k in ("recompute", "backward")]
    cut = int(breaks[0][1:])
    # the later segment (cut..2) re-runs and runs its backwards before the earlier one re-runs
    later = [("recompute", f"u{i}") for i in range(cut, 3)]
    assert order[:len(later)] == later
    assert order.index(("backward", f"u{cut}")) < order.index(("recompute", "u0"))
