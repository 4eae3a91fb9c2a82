"""The efficiency table and calibrate(): constants as data, fitted to measured op times."""
from __future__ import annotations

import functools

import numpy as np
import pandas as pd
import pytest

import memflow
from memflow.errors import ClusterError
from memflow.hardware import EFFICIENCY, GPUS, EDGE_BOARDS, LINK_KINDS, calibrate
from memflow.hardware.calibration import predicted_seconds
from memflow.hardware.efficiency import efficiency, table
from memflow.hardware.local import EXAMPLE_FIGURES, local_cluster


def test_every_constant_has_a_source_and_feeds_the_catalogue():
    assert all(e.source.strip() for e in EFFICIENCY)
    for gpu in (*GPUS.values(), *EDGE_BOARDS.values()):
        for figure in ("compute_efficiency", "memory_efficiency", "launch_overhead"):
            assert getattr(gpu, figure) == efficiency(gpu.name, figure)
    for kind in LINK_KINDS.values():
        assert kind.efficiency == efficiency(kind.name, "efficiency")
    assert not table().duplicated(["applies_to", "figure"]).any()
    with pytest.raises(KeyError, match="V100-16GB"):
        efficiency("nope", "compute_efficiency")


def test_preset_devices_say_datasheet():
    c = memflow.Cluster.preset("2xA100-80GB")
    assert set(c.devices["figures"]) == {"datasheet"}
    assert "datasheet" in c.figures_note()


@functools.cache
def _units() -> tuple[pd.DataFrame, ...]:
    return tuple(memflow.zoo.graph(name, batch_size=8, **cfg).units for name, cfg in (
        ("resnet50", {"width": 8, "image_size": 32}),
        ("gpt2", {"n_layer": 1, "hidden": 64, "n_head": 4, "vocab": 500, "seq_len": 32})))


def _unit_work() -> pd.DataFrame:
    """Forward and backward of every unit of two zoo models: realistic work to time."""
    rows = []
    for u in _units():
        for d in ("fwd", "bwd"):
            rows.append(pd.DataFrame({"flops": u[f"{d}_flops"],
                                      "bytes_moved": u[f"{d}_bytes_moved"],
                                      "ops": u[f"{d}_ops"]}))
    return pd.concat(rows, ignore_index=True)


def _cpu() -> memflow.Cluster:
    # a CPU's balance (tens of GFLOP/s, ~10 GB/s): the units are a mix of compute-bound
    # (matmuls, convolutions) and memory-bound (norms, activations) work
    return local_cluster(EXAMPLE_FIGURES, 1, threads=None)


def test_calibrate_recovers_the_efficiencies_behind_noisy_times():
    work = _unit_work()
    rng = np.random.default_rng(0)
    truth = (60e9 * 0.42, 12e9 * 0.71, 9e-6)
    work["seconds"] = predicted_seconds(work, *truth) * rng.normal(1, 0.03, len(work))
    f, b = work["flops"] / truth[0], work["bytes_moved"] / truth[1]
    assert 0.2 < (f > b).mean() < 0.8          # both rates matter
    dev = calibrate(work, _cpu()).devices.loc["cpu0"]
    assert dev["compute_efficiency"] == pytest.approx(0.42, rel=0.05)
    assert dev["memory_efficiency"] == pytest.approx(0.71, rel=0.05)
    assert dev["launch_overhead"] == pytest.approx(9e-6, rel=0.1)
    assert dev["figures"] == "calibrated"


def test_a_rate_above_the_peak_raises_the_peak():
    work = _unit_work()
    work["seconds"] = predicted_seconds(work, 60e9 * 1.5, 12e9 * 0.8, 5e-6)
    dev = calibrate(work, _cpu()).devices.loc["cpu0"]
    assert dev["compute_efficiency"] == 1.0
    assert dev["peak_flops_fp32"] == pytest.approx(60e9 * 1.5, rel=0.02)


def test_half_precision_rows_calibrate_against_the_16_bit_peak():
    c = memflow.Cluster.preset("1xA100-80GB")
    work = _unit_work()
    work["flops"] *= 1000           # tensor-core rates: make the rows compute-bound
    work["dtype"] = "bfloat16"
    work["seconds"] = predicted_seconds(work, 312e12 * 0.5, 2039e9 * 0.9, 4e-6)
    dev = calibrate(work, c).devices.loc["gpu0"]
    assert dev["compute_efficiency"] == pytest.approx(0.5, rel=0.02)


def test_calibrating_some_devices_leaves_the_others_datasheet():
    c = memflow.Cluster.preset("2xV100-16GB")
    work = _unit_work()
    work["seconds"] = predicted_seconds(work, 15.7e12 * 0.5, 900e9 * 0.8, 5e-6)
    out = calibrate(work, c, devices=["gpu1"])
    assert out.devices["figures"].tolist() == ["datasheet", "calibrated"]
    assert "V100-16GB: datasheet" in out.figures_note()
    assert "V100-16GB: calibrated" in out.figures_note()


def test_measured_times_errors_name_the_column():
    c = memflow.Cluster.preset("1xV100-16GB")
    with pytest.raises(ClusterError, match=r"lack the columns \['seconds'\]"):
        calibrate(pd.DataFrame({"flops": [1.0], "bytes_moved": [1.0], "ops": [1]}), c)
    with pytest.raises(ClusterError, match="row 0: seconds must be a number"):
        calibrate(pd.DataFrame({"flops": [1.0], "bytes_moved": [1.0], "ops": [1],
                                "seconds": ["x"]}), c)
    with pytest.raises(ClusterError, match="unknown device 'gpu9'"):
        calibrate(pd.DataFrame({"flops": [1.0], "bytes_moved": [1.0], "ops": [1],
                                "seconds": [1.0]}), c, devices=["gpu9"])


def test_the_report_says_which_figures_are_measured():
    from memflow.report.page import report_html

    g = memflow.zoo.graph("chain", batch_size=8, n=2, width=16)
    work = _unit_work()
    work["seconds"] = predicted_seconds(work, 15.7e12 * 0.5, 900e9 * 0.8, 5e-6)
    c = calibrate(work, memflow.Cluster.preset("2xV100-16GB"), devices=["gpu1"])
    result = memflow.simulate(g, memflow.Strategy.data_parallel(g, c), c)
    page = report_html(result, cluster=c)
    assert "<th>time figures</th>" in page
    assert "V100-16GB: datasheet" in page and "V100-16GB: calibrated" in page


def test_bfloat16_rows_on_a_device_without_bf16_units_calibrate_against_fp32():
    c = memflow.Cluster.preset("1xV100-16GB")
    work = _unit_work()
    work["flops"] *= 100
    work["dtype"] = "bfloat16"      # a V100 runs bfloat16 at its FP32 rate
    work["seconds"] = predicted_seconds(work, 15.7e12 * 0.5, 900e9 * 0.8, 5e-6)
    dev = calibrate(work, c).devices.loc["gpu0"]
    assert dev["compute_efficiency"] == pytest.approx(0.5, rel=0.02)
