"""The shape-class rate table's measured terms (nn.Linear's kernels, kernels after other
traffic) and its refit to measured kernel times (calibrate)."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, strategies as st

import memflow
from memflow.errors import ClusterError
from memflow.hardware import calibrate, kernels
from memflow.hardware.calibration import calibrate_kernels
from memflow.hardware.efficiency import BASES, table
from memflow.hardware.local import EXAMPLE_FIGURES, local_cluster


def test_matmul_class_is_timed_as_nn_linear_runs_it():
    flops, fwd, bwd = kernels.grid_kernel(("matmul", 4, 6, 5), 1)
    assert flops == 2 * 4 * 6 * 5
    out = fwd()
    assert out.shape == (4, 6)
    grad_in, grad_w, grad_b = bwd()     # input, weight and bias gradients, as autograd's
    assert grad_in.shape == (4, 5) and grad_w.shape == (6, 5) and grad_b.shape == (6,)
    x, w, b = torch.randn(4, 5, requires_grad=True), torch.randn(6, 5), torch.randn(6)
    torch.nn.functional.linear(x, w, b).sum().backward()
    assert torch.allclose(x.grad, torch.ones(4, 6) @ w)


def test_each_kernel_follows_the_evictor_and_its_own_time_is_taken_off():
    evict = kernels.evictor(1024)

    def fake(call):          # the evictor alone 1 ms (2 by CPU time), each pair 3 ms (5)
        return (1e-3, 2e-3) if call is evict else (3e-3, 5e-3)
    t = kernels.measure_grid("tiny", fake, evict)
    flops = [kernels.grid_kernel(s, 1)[0] for s in kernels.GRID["tiny"]]
    assert [r[4] for r in t["one"]] == pytest.approx([f / 2e-3 for f in flops])
    assert [r[5] for r in t["cpu"]] == pytest.approx([2 * f / 3e-3 for f in flops])
    # a pair timed no slower than the evictor alone (a loaded machine): floored, not negative
    assert all(r[4] > 0 for r in kernels.measure_grid("tiny", lambda c: (1e-3, 1e-3),
                                                       evict)["cpu"])


def test_cache_bytes_reads_the_cache_size_or_gives_the_default():
    assert kernels.cache_bytes() >= 2**14
    assert kernels.cache_bytes(level=99, default=123) == 123
    out = kernels.evictor(4096)()             # a copy of 4 KiB: 1024 floats
    assert out.numel() == 1024


TABLE = [["matmul", 16, 16, 16, 2e9, 1e9], ["matmul", 256, 256, 256, 8e9, 6e9],
         ["conv", 128, 16, 144, 3e9, 2e9]]


@given(st.floats(0.2, 5.0), st.floats(0.2, 5.0))
def test_fit_recovers_the_rates_of_kernels_timed_on_the_grid(a, b):
    m = [16, 256, 16]
    rates = [2e9 * a, 8e9 * b, 1e9 * b]            # forward, forward, backward
    backward = [False, False, True]
    seconds = [2.0 * x**3 * (2 if bk else 1) / r for x, r, bk in zip(m, rates, backward)]
    fitted = kernels.fit_table(TABLE, ["matmul"] * 3, m, m, m, [1] * 3, backward, seconds)
    assert fitted[0][4] == pytest.approx(rates[0], rel=1e-2)
    assert fitted[1][4] == pytest.approx(rates[1], rel=1e-2)
    assert fitted[0][5] == pytest.approx(rates[2], rel=1e-2)
    assert fitted[1][5] == 6e9 and fitted[2] == TABLE[2]     # nothing measured: kept


def test_fit_between_grid_points_moves_the_predicted_rate_to_the_measured_one():
    m, measured = 64, 3e9
    seconds = 2.0 * m**3 / measured
    fitted = kernels.fit_table(TABLE, ["matmul"], [m], [m], [m], [1], [False], [seconds])
    before = kernels.class_rates(TABLE, ["matmul"], [m], [m], [m])[0][0]
    after = kernels.class_rates(fitted, ["matmul"], [m], [m], [m])[0][0]
    assert abs(np.log(after / measured)) < 0.05 * abs(np.log(before / measured))


def _kernel_times(rate: float) -> pd.DataFrame:
    g = memflow.zoo.graph("mlp", batch_size=32, width=64)
    rows = [dict(zip(("class", "m", "n", "k", "count"), r)) for cell in g.units["kernels"]
            for r in cell]
    df = pd.DataFrame(rows)
    df["seconds"] = 2.0 * df["m"] * df["n"] * df["k"] * df["count"] / rate
    return df


def test_calibrate_refits_a_local_cpus_table_and_the_prediction_follows():
    g = memflow.zoo.graph("mlp", batch_size=32, width=64)
    c = local_cluster(EXAMPLE_FIGURES, 1, threads=1)
    s = memflow.Strategy.data_parallel(g, ["cpu0"])
    slow = calibrate(_kernel_times(1e9), c)
    fast = calibrate(_kernel_times(1e11), c)
    assert slow.devices.loc["cpu0", "figures"] == "calibrated"
    assert json.loads(slow.devices.loc["cpu0", "kernel_rates"]) != json.loads(
        c.devices.loc["cpu0", "kernel_rates"])
    times = [memflow.simulate(g, s, x).iteration_time for x in (slow, c, fast)]
    assert times[0] > times[1] > times[2]


def test_kernel_times_are_checked_and_need_a_measured_table():
    c = local_cluster(EXAMPLE_FIGURES, 1, threads=1)
    good = _kernel_times(1e10)
    with pytest.raises(ClusterError, match="no shape-class rate table"):
        calibrate_kernels(good, memflow.Cluster.preset("1xV100-16GB"))
    with pytest.raises(ClusterError, match=r"lack the columns \['seconds'\]"):
        calibrate_kernels(good.drop(columns="seconds"), c)
    with pytest.raises(ClusterError, match="class 'gemm' is not one of"):
        calibrate_kernels(good.assign(**{"class": "gemm"}), c)
    with pytest.raises(ClusterError, match="phase 'bwd' is not one of"):
        calibrate_kernels(good.assign(phase="bwd"), c)
    with pytest.raises(ClusterError, match="seconds must be a number > 0"):
        calibrate_kernels(good.assign(seconds=0.0), c)


def test_every_efficiency_says_whether_it_is_published_assumed_or_measured():
    t = table()
    assert set(t["basis"]) == {"published", "assumption", "measured"}
    assert set(BASES.values()) == set(t["basis"])
    cpu = t[t["applies_to"] == "cpu"].set_index("figure")["basis"]
    assert cpu["kernel_flops"] == cpu["op_overhead"] == "measured"
    assert cpu["cpu_adam_rate"] == "assumption"
    assert (t[t["applies_to"] == "V100-16GB"]["basis"] == "published").all()
