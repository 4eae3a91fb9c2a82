"""The compiled per-unit durations give, to the bit, what the numpy expressions of the cost
model give (:func:`memflow.sim.costs.ring_time` and the roofline), so that compiling them
changed no simulated time."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from memflow.sim.costs import ring_time
from memflow.sim.durations import _unit_durations


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2 ** 32 - 1), st.integers(1, 40))
def test_compiled_durations_equal_the_numpy_expressions(seed, n):
    rng = np.random.default_rng(seed)
    pos = lambda *shape: rng.lognormal(0.0, 3.0, shape)            # noqa: E731
    deg, rate, mem, launch = pos(n), pos(n), pos(n), pos(n)
    ring, replica = pos(n, 3), pos(n, 3)
    ring[:, 2] = rng.integers(1, 9, n)               # members of each ring
    replica[:, 2] = rng.integers(1, 9, n)
    tp_out, tp_in, gather, scatter = (pos(n) * (rng.random(n) < 0.7) for _ in range(4))
    flops, moved, ops = pos(3, n)
    part = rng.random((3, n))
    expensive = flops * part[0], moved * part[1], np.floor(ops * part[2])
    bwd = pos(3, n)
    out = np.empty((5, n))
    _unit_durations(deg, rate, mem, launch, ring, replica, tp_out, tp_in, gather, scatter,
                    flops, moved, ops, *expensive, *bwd, out)

    def compute(f, m, o, work):
        return (np.maximum(f / deg / rate, m / deg / mem) + o * launch
                + ring_time(work, ring[:, 0], ring[:, 1], ring[:, 2]))

    expected = [compute(flops, moved, ops, tp_out),
                compute(flops - expensive[0], moved - expensive[1], ops - expensive[2], tp_out),
                compute(*bwd, tp_in),
                ring_time(gather, replica[:, 0], replica[:, 1], replica[:, 2]) / 2,
                ring_time(scatter, replica[:, 0], replica[:, 1], replica[:, 2]) / 2]
    for row, want in zip(out, expected):
        assert np.array_equal(row, want)
