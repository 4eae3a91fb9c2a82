"""Cluster.local(): the micro-benchmark, its cache, and the cluster built from its figures."""
from __future__ import annotations

import pytest

import memflow
from memflow._jsonio import read_json, write_json
from memflow.errors import ClusterError
from memflow.hardware import local as local_mod
from memflow.hardware import microbench
from memflow.hardware.local import EXAMPLE_FIGURES, cache_dir, cache_file, local_cluster


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMFLOW_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_cache_folder_follows_xdg_then_home(monkeypatch, tmp_path):
    monkeypatch.delenv("MEMFLOW_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_dir() == tmp_path / "memflow"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "memflow"


def test_measured_once_then_cached_and_remeasured_on_request(cache, monkeypatch):
    calls = []

    def fake(size="default", *, collectives=True):
        calls.append(size)
        return dict(EXAMPLE_FIGURES)
    monkeypatch.setattr(local_mod, "measure", fake)
    a = memflow.Cluster.local()
    b = memflow.Cluster.local()
    assert calls == ["default"] and a == b
    assert read_json(cache_file())["format"] == "memflow.local/6"
    memflow.Cluster.local(remeasure=True)
    assert len(calls) == 2


def test_cache_of_another_format_is_measured_again(cache, monkeypatch):
    write_json(cache_file(), {**EXAMPLE_FIGURES, "format": "memflow.local/0"})
    monkeypatch.setattr(local_mod, "measure", lambda *a, **k: dict(EXAMPLE_FIGURES))
    memflow.Cluster.local()
    assert read_json(cache_file())["format"] == "memflow.local/6"


def test_tiny_micro_benchmark_gives_positive_rates():
    f = microbench.measure("tiny", collectives=False)
    for key in ("matmul_flops", "conv_flops", "copy_bandwidth"):
        assert f[key]["all"] > 0 and f[key]["one"] > 0
    assert 0 < f["launch_overhead"] < 1e-2
    assert f["cores"] >= 1 and f["memory_bytes"] > 0
    assert 0 < f["session_cores"] <= f["cores"] + 0.2      # CPU time over wall time


def test_gloo_allreduce_between_two_processes():
    ar = microbench._allreduce("tiny")
    assert ar["processes"] == 2 and ar["bandwidth"] > 0 and ar["latency"] > 0
    assert ar["session_cores"] > 0


def test_unknown_size_names_the_valid_ones():
    with pytest.raises(ClusterError, match="'default', 'tiny'"):
        microbench.measure("huge")


def test_one_process_uses_every_thread_several_share_the_machine(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    one = local_cluster(EXAMPLE_FIGURES, 1).devices.loc["cpu0"]
    assert one["peak_flops_fp32"] == 60e9 and one["mem_bandwidth"] == 12e9
    assert one["compute_efficiency"] == pytest.approx((60 + 40) / 2 / 60)
    two = local_cluster(EXAMPLE_FIGURES, 2).devices.loc["cpu0"]
    # one thread each (torchrun's default) on two cores: a core each, memory shared
    assert two["peak_flops_fp32"] == 32e9 and two["mem_bandwidth"] == 12e9 / 2
    four = local_cluster(EXAMPLE_FIGURES, 4).devices.loc["cpu0"]
    assert four["peak_flops_fp32"] == 32e9 / 2 and four["mem_bandwidth"] == 12e9 / 4
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    single = local_cluster(EXAMPLE_FIGURES, 1).devices.loc["cpu0"]
    assert single["peak_flops_fp32"] == 32e9 and single["mem_bandwidth"] == 9e9


def test_processes_meet_over_the_measured_loopback(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    c = local_cluster(EXAMPLE_FIGURES, 4)
    ar = EXAMPLE_FIGURES["allreduce"]
    # measured at 2 processes, a core each; 4 on 2 cores copy and sum at half a core each
    assert c.ring_bandwidth(list(c.devices.index)) == pytest.approx(ar["bandwidth"] / 2)
    assert c.ring_latency(list(c.devices.index)) == pytest.approx(ar["latency"])
    # an offload is a copy in DRAM: half the copy bandwidth (read + write), not the loopback
    assert c.bandwidth("cpu0", "host0") == pytest.approx(12e9 / 4 / 2)
    assert set(c.devices["figures"]) == {"measured"}
    assert memflow.Cluster.from_dict(c.to_dict()) == c


def test_a_strategy_runs_on_the_local_cluster():
    c = local_cluster(EXAMPLE_FIGURES, 2, names=["gpu0", "gpu1"])
    g = memflow.zoo.graph("chain", batch_size=8, n=2, width=16)
    r = memflow.simulate(g, memflow.Strategy.data_parallel(g, ["gpu0", "gpu1"]), c)
    assert r.iteration_time > 0


def test_several_processes_need_the_allreduce_figures():
    figures = {k: v for k, v in EXAMPLE_FIGURES.items() if k != "allreduce"}
    local_cluster(figures, 1)
    with pytest.raises(ClusterError, match="collectives=True"):
        local_cluster(figures, 2)
    with pytest.raises(ClusterError, match="2 device names"):
        local_cluster(EXAMPLE_FIGURES, 2, names=["a"])


def test_step_figures_are_timed_by_both_clocks():
    f = microbench.measure("tiny", collectives=False)
    for key in (*microbench.STEP_FIGURES, "matmul_flops", "conv_flops", "copy_bandwidth"):
        assert f[key]["one"] > 0 and f[key]["cpu"] > 0, key
    assert f["op_overhead"]["cpu"] < 1e-2 and f["elementwise_bandwidth"]["cpu"] > 1e6


def test_cpu_clock_cluster_takes_the_cpu_time_figures(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    d = local_cluster(EXAMPLE_FIGURES, 1, threads=1, clock="cpu").devices.loc["cpu0"]
    assert d["peak_flops_fp32"] == 34e9 and d["mem_bandwidth"] == 10e9
    assert d["clock"] == "cpu" and d["launch_overhead"] == d["op_overhead"] == 3.5e-6
    assert d["backward_flops"] == (30e9 + 20e9) / 2 and d["small_flops"] == (17e9 + 9e9) / 2
    # four one-thread processes on two cores: half a core each, overheads twice as long
    four = local_cluster(EXAMPLE_FIGURES, 4).devices.loc["cpu0"]
    assert four["op_overhead"] == 2 * 4e-6 and four["elementwise_bandwidth"] == 30e9 / 2
    for n, threads in ((2, 1), (1, None)):
        with pytest.raises(ClusterError, match="'cpu' for one process of one thread"):
            local_cluster(EXAMPLE_FIGURES, n, threads=threads, clock="cpu")


def test_cpu_time_model_adds_up_on_local_cpus_only():
    from memflow.sim.cpu_time import cpu_figures

    g = memflow.zoo.graph("chain", batch_size=8, n=2, width=16)
    local = local_cluster(EXAMPLE_FIGURES, 1, threads=1, clock="cpu")
    s = memflow.Strategy.data_parallel(g, ["cpu0"])
    cpu = cpu_figures(local)
    assert cpu["clock"] == "cpu" and cpu["op_overhead"] == 3.5e-6
    r = memflow.simulate(g, s, local)
    # every op costs at least its dispatch, forward and backward: the sum, not a roofline
    ops = g.units["fwd_ops"].sum() * 3.5e-6 + g.units["bwd_ops"].sum() * 2.5e-6
    assert r.iteration_time > ops
    catalogue = memflow.Cluster.preset("1xV100-16GB")
    assert cpu_figures(catalogue) is None


def test_processes_of_one_session_split_its_measured_cores(monkeypatch):
    # Linux shares a busy machine between sessions: the one-thread figures were timed at
    # half a core, and two processes of this session get a quarter each, not half
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    loaded = {**EXAMPLE_FIGURES, "session_cores": 0.5,
              "allreduce": {**EXAMPLE_FIGURES["allreduce"], "session_cores": 1.0}}
    one = local_cluster(loaded, 1, threads=1).devices.loc["cpu0"]
    two = local_cluster(loaded, 2).devices.loc["cpu0"]
    assert one["peak_flops_fp32"] == 32e9 and two["peak_flops_fp32"] == 16e9
    assert two["op_overhead"] == 2 * 4e-6 and two["collective_overlap"] == 0.0
    # the all-reduce was measured with half a core per process, now a quarter
    c = local_cluster(loaded, 2)
    assert c.ring_bandwidth(["cpu0", "cpu1"]) == pytest.approx(1.5e9 / 2)
    # an idle 8-core machine: two processes leave cores for gloo's threads
    idle = {**EXAMPLE_FIGURES, "cores": 8, "session_cores": 8.0}
    assert local_cluster(idle, 2).devices["collective_overlap"].tolist() == [1.0, 1.0]
    assert local_cluster(idle, 2).devices.loc["cpu0", "peak_flops_fp32"] == 32e9


def test_an_allreduce_without_a_free_core_is_charged_on_the_compute():
    g = memflow.zoo.graph("mlp", batch_size=8, width=512, units="blocks")   # two buckets
    busy = local_cluster(EXAMPLE_FIGURES, 2, threads=1)          # 2 processes, 2 cores
    free = memflow.Cluster.from_dict({**busy.to_dict(), "devices": [
        {**d, "collective_overlap": 1.0} for d in busy.to_dict()["devices"]]})
    s = memflow.Strategy.data_parallel(g, ["cpu0", "cpu1"])
    serial, beside = memflow.simulate(g, s, busy), memflow.simulate(g, s, free)
    t = serial.timeline
    compute = (t["end"] - t["start"])[t["kind"] != "allreduce"].sum()
    assert serial.iteration_time == pytest.approx(compute)     # one stream: nothing beside
    assert (t.loc[t["kind"] == "allreduce", "end"] == t.loc[t["kind"] == "allreduce",
                                                            "start"]).all()
    assert serial.iteration_time > beside.iteration_time
