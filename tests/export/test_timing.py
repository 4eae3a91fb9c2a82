"""validate(time=True) and step_time: the exported script timed against the simulated step."""
from __future__ import annotations

import pytest
import torch

import memflow
from memflow._jsonio import write_json
from memflow.errors import ExportError
from memflow.export import validate
from memflow.export.timing import gpu_problem, step_time
from memflow.hardware.local import EXAMPLE_FIGURES, cache_file

needs_no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only path")


@pytest.fixture
def cached(tmp_path, monkeypatch):
    """Cluster.local() from a cached fixture: no micro-benchmark runs in these tests."""
    monkeypatch.setenv("MEMFLOW_CACHE_DIR", str(tmp_path))
    write_json(cache_file(), EXAMPLE_FIGURES)


def _chain():
    g = memflow.zoo.graph("chain", batch_size=8, n=2, width=16, units="blocks")
    return g, memflow.Strategy.data_parallel(g, ["gpu0"]).with_policy(recompute=["layers.0"])


def test_validate_time_adds_the_step_time_row(cached, monkeypatch):
    from memflow.export import timing

    # the script itself runs in test_step_time_keeps_every_timed_step: one launch is enough
    monkeypatch.setattr(timing, "measured_step_times",
                        lambda *a, **k: {"wall": [0.25, 0.5, 0.75], "cpu": [0.2, 0.4, 0.6]})
    g, s = _chain()
    model, inputs = memflow.zoo.get("chain", 8, n=2, width=16, device="cpu")
    df = validate(model, inputs, s, g, devices={"gpu0": "cpu"}, time=True,
                  model_options={"n": 2, "width": 16})
    assert list(df.index) == ["saved_bytes", "offloaded_bytes", "step_time"]
    row = df.loc["step_time"]
    assert row["predicted"] > 0 and row["measured"] == 0.5      # the wall clock's mean
    assert row["error"] == pytest.approx(0.5 / row["predicted"] - 1)


def test_step_time_runs_the_exported_script(cached):
    g, s = _chain()
    cluster = memflow.Cluster.local(names=["gpu0"])
    r = step_time(s, "chain", cluster, model_options={"n": 2, "width": 16}, graph=g,
                  warmup=1, steps=2)
    assert len(r.attrs["step_times"]) == 2 and r.attrs["skipped"] is None
    assert r.loc["step_time", "measured"] == pytest.approx(sum(r.attrs["step_times"]) / 2)
    # the script times each step by both clocks; this cluster's is the wall clock
    assert r.attrs["clock"] == "wall" and r.attrs["step_times"] == r.attrs["wall_times"]
    assert len(r.attrs["cpu_times"]) == 2 and all(t > 0 for t in r.attrs["cpu_times"])


def test_a_cpu_clock_cluster_is_compared_with_the_steps_cpu_time(monkeypatch):
    from memflow.export import timing
    from memflow.hardware.local import local_cluster

    monkeypatch.setattr(timing, "measured_step_times",
                        lambda *a, **k: {"wall": [0.25, 0.5, 0.75], "cpu": [0.2, 0.4, 0.6]})
    g, s = _chain()
    cluster = local_cluster(EXAMPLE_FIGURES, 1, names=["gpu0"], threads=1, clock="cpu")
    r = step_time(s, "chain", cluster, model_options={"n": 2, "width": 16}, graph=g)
    assert r.attrs["clock"] == "cpu" and r.loc["step_time", "measured"] == 0.4
    assert r.attrs["wall_times"] == [0.25, 0.5, 0.75]


def test_wall_time_is_the_runs_mean_and_cpu_time_the_median(cached, monkeypatch):
    # a step that waited for a core counts by the wall clock, as the wall figures' windows
    # count their waits; CPU time has none, and its median drops one slowed step
    from memflow.export import timing

    monkeypatch.setattr(timing, "measured_step_times",
                        lambda *a, **k: {"wall": [0.1, 0.1, 0.7], "cpu": [0.1, 0.1, 0.4]})
    g, s = _chain()
    r = step_time(s, "chain", memflow.Cluster.local(names=["gpu0"]),
                  model_options={"n": 2, "width": 16}, graph=g)
    assert r.loc["step_time", "measured"] == pytest.approx(0.3)
    assert timing.step_seconds(r.attrs["cpu_times"], "cpu") == 0.1


@needs_no_gpu
def test_gpu_path_is_skipped_with_its_reason_printed(capsys):
    g, s = _chain()
    assert "no CUDA device here" in gpu_problem(s)
    assert gpu_problem(s, {"gpu0": "cpu"}) is None
    model, inputs = memflow.zoo.get("chain", 8, n=2, width=16, device="cpu")
    df = validate(model, inputs, s, g, devices={"gpu0": "cpu"}, time=True,
                  cluster=memflow.Cluster.preset("1xV100-16GB"),
                  model_options={"n": 2, "width": 16})
    assert "step_time" not in df.index and "peak_bytes" not in df.index
    out = capsys.readouterr().out
    assert "peak_bytes" not in out          # the memory rows ran on the CPU, as asked
    assert out.startswith("step_time: skipped")
    validate(model, inputs, s, g, time=True, cluster=memflow.Cluster.preset("1xV100-16GB"),
             model_options={"n": 2, "width": 16})
    out = capsys.readouterr().out
    assert "peak_bytes: skipped, no CUDA device here" in out
    assert "step_time: skipped, no CUDA device here" in out
    assert "torch.cuda.is_available() is False" in out


def test_time_needs_a_model_the_script_can_rebuild():
    g, s = _chain()
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    g2 = memflow.from_torch(model, torch.randn(2, 4), units="leaves")
    s2 = memflow.Strategy.data_parallel(g2, ["gpu0"])
    with pytest.raises(ExportError, match="factory="):
        validate(model, torch.randn(2, 4), s2, g2, devices={"gpu0": "cpu"}, time=True)
