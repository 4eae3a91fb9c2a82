"""The compiled durations give, to the bit, what the numpy expressions of the cost model give
(:func:`memflow.sim.costs.ring_time`, the roofline, ``np.bincount`` and ``np.sum``), so that
compiling them changed no simulated time."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from memflow.sim.costs import OPTIMIZER_LAUNCHES, pairwise_sum, ring_time
from memflow.sim.durations import _layout_durations, _unit_durations

# columns of a layout's row of rates (memflow.sim.durations)
DEGREE, F32, F16, MEM, LAUNCH, PARAM_RING, REPLICA_RING, BF16 = 0, 1, 2, 3, 4, 5, 8, 15


def _rates(rng, k: int) -> np.ndarray:
    """``k`` layouts' rows of rates: positive, with whole ring members."""
    rates = rng.lognormal(0.0, 3.0, (k, 16))
    rates[:, DEGREE] = rng.integers(1, 9, k)
    rates[:, PARAM_RING + 2] = rng.integers(1, 9, k)      # members of each ring
    rates[:, REPLICA_RING + 2] = rng.integers(1, 9, k)
    return rates


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2 ** 32 - 1), st.integers(1, 40), st.integers(1, 6))
def test_compiled_durations_equal_the_numpy_expressions(seed, n, k):
    rng = np.random.default_rng(seed)
    pos = lambda *shape: rng.lognormal(0.0, 3.0, shape)            # noqa: E731
    L, M, rates = rng.integers(0, k, n), int(rng.integers(1, 9)), _rates(rng, k)
    half, bf16 = rng.random(n) < 0.5, rng.random(n) < 0.5
    tp_out, tp_in, gather, scatter = (pos(n) * (rng.random(n) < 0.7) for _ in range(4))
    flops, moved, ops = pos(3, n)
    part = rng.random((3, n))
    expensive = flops * part[0], moved * part[1], np.floor(ops * part[2])
    bwd = pos(3, n)
    out = np.empty((7, n))
    _unit_durations(L, M, rates, half, bf16, tp_out, tp_in, gather, scatter, flops, moved, ops,
                    *expensive, *bwd, out)

    deg = rates[L, DEGREE] * M
    rate = np.where(half, np.where(bf16, rates[L, BF16], rates[L, F16]), rates[L, F32])
    mem, launch = rates[L, MEM], rates[L, LAUNCH]
    ring, replica = rates[L, PARAM_RING:PARAM_RING + 3], rates[L, REPLICA_RING:REPLICA_RING + 3]

    def compute(f, m, o, work):
        return (np.maximum(f / deg / rate, m / deg / mem) + o * launch
                + ring_time(work, ring[:, 0], ring[:, 1], ring[:, 2]))

    expected = [compute(flops, moved, ops, tp_out),
                compute(flops - expensive[0], moved - expensive[1], ops - expensive[2], tp_out),
                compute(*bwd, tp_in),
                ring_time(gather, replica[:, 0], replica[:, 1], replica[:, 2]) / 2,
                ring_time(scatter, replica[:, 0], replica[:, 1], replica[:, 2]) / 2, deg, rate]
    for row, want in zip(out, expected):
        assert np.array_equal(row, want)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2 ** 32 - 1), st.integers(1, 400), st.integers(1, 6))
def test_compiled_layout_durations_equal_the_numpy_expressions(seed, n, k):
    rng = np.random.default_rng(seed)
    L, rates = rng.integers(0, k, n), _rates(rng, k)
    update, gradients, host_elements, weights = rng.lognormal(0.0, 8.0, (4, n))
    regather = rng.lognormal(0.0, 8.0, n) * (rng.random(n) < rng.random())
    off = rng.random(n) < rng.random() * (rng.random() < 0.5)
    bucket_layout = rng.integers(0, k, 7)
    bucket_bytes = rng.lognormal(0.0, 8.0, 7)
    allreduce, optimizer, regathers, gathers, sums, offloads = _layout_durations(
        L, rates, update, bucket_layout, bucket_bytes, regather, off, gradients,
        host_elements, weights)

    rr = rates[bucket_layout, REPLICA_RING:REPLICA_RING + 3]
    assert np.array_equal(allreduce, ring_time(bucket_bytes, rr[:, 0], rr[:, 1], rr[:, 2]))
    assert np.array_equal(optimizer, np.bincount(L, weights=update, minlength=k) / rates[:, MEM]
                          + OPTIMIZER_LAUNCHES * rates[:, LAUNCH])
    busy = np.isin(np.arange(k), L[(regather > 0) | off])
    for i in range(k):
        mine = L == i
        assert gathers[i] == (busy[i] and regather[mine].any())
        if gathers[i]:
            assert regathers[i] == float(ring_time(float(regather[mine].sum()),
                                                   *rates[i, REPLICA_RING:REPLICA_RING + 3]) / 2)
        assert (i in offloads.tolist()) == off[mine].any()
        if i in offloads.tolist():
            assert sums[:, i].tolist() == [float(np.sum(gradients[mine & off])),
                                           float(np.sum(host_elements[mine])),
                                           float(np.sum(weights[mine & off]))]


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 2 ** 32 - 1), st.integers(0, 3000))
def test_pairwise_sum_is_numpys_sum(seed, n):
    a = np.random.default_rng(seed).lognormal(0.0, 8.0, n) * np.where(np.arange(n) % 3, 1, -1)
    assert pairwise_sum(a, 0.0) == np.sum(a)
