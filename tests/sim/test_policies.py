"""Hand-checked memory policies and the simulator against memflow.estimate."""
import numpy as np
import pytest

from memflow.hardware.presets import build
from memflow.sim import estimate
from memflow.memory.blocks import ACTIVATIONS
from memflow.sim import Simulator, simulate
from memflow.sim.kinds import K_BWD
from memflow.strategy import Strategy

from .graphs import chain, cluster

V100 = cluster("1xV100-16GB")


def activations_when_backward_starts(result) -> float:
    run = result.run
    first_bwd = min(i for i, k in enumerate(run.tasks.kind) if k == K_BWD)
    L = run.device
    before = (L.task < first_bwd) & (L.category == ACTIVATIONS)
    return float(L.delta[before].sum())


@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam"])
def test_single_device_keep_all_matches_estimate(optimizer):
    g = chain(tmp=(7, 70, 700))
    r = simulate(g, Strategy.single_device(g), V100, optimizer=optimizer)
    est = estimate(g, "cuda", optimizer=optimizer)
    assert r.peak_memory["gpu0"] == est.loc["total", "at_peak"]
    assert r.breakdown().loc["gpu0"].sum() == est.loc["total", "at_peak"]


@pytest.mark.parametrize("policy, removed", [
    ("recompute", 20),                 # u1's internal tensor; its input is a segment input
    ("offload", 200 + 20),             # everything u1 saves goes to the host
    ("compress:0.01", 220 - 220 / 5),  # ... or stays compressed (ratio 5 at 1e-2)
])
def test_policies_remove_exactly_what_they_drop(policy, removed, monkeypatch):
    g = chain()
    sim = Simulator(g, V100)
    sim._compress = (lambda eb, dtype, kind: 5.0, lambda bw, **kw: 1e11, lambda b, **kw: 40.0,
                     lambda **kw: 0.0)
    keep = activations_when_backward_starts(sim.result(Strategy.single_device(g)))
    s = Strategy.single_device(g).with_policy({"u1": policy})
    got = activations_when_backward_starts(sim.result(s))
    assert keep == 660        # the model's output (50) is freed after the loss, before backward
    assert keep - got == pytest.approx(removed)


def test_offload_uses_host_memory_and_the_host_link():
    g = chain()
    r = simulate(g, Strategy.single_device(g).with_policy(offload=["u1"]), V100)
    assert r.host_peak.iloc[0] == 220
    tl = r.timeline
    assert set(tl["kind"]) >= {"offload", "prefetch"}
    off = tl[tl["kind"] == "offload"].iloc[0]
    assert "gpu0->host0" in off["resource"]


def test_offloading_past_host_memory_is_infeasible_naming_the_host():
    # an edge board's memory is unified: its host has no memory of its own to offload into
    g = chain()
    jetson = cluster("jetson-nano-4GB")
    assert simulate(g, Strategy.single_device(g), jetson).feasible
    r = simulate(g, Strategy.single_device(g).with_policy(offload=["u1"]), jetson)
    assert r.host_peak["host0"] == 220 and r.host_capacity["host0"] == 0
    assert not r.feasible and r.over_capacity == ["host0"]
    ev = Simulator(g, jetson).evaluate(Strategy.single_device(g).with_policy(offload=["u1"]))
    assert not ev.feasible and ev.over == 220
    small = build("V100-16GB", 1, host_memory=219)
    assert not simulate(g, Strategy.single_device(g).with_policy(offload=["u1"]), small).feasible
    big = build("V100-16GB", 1, host_memory=220)
    assert simulate(g, Strategy.single_device(g).with_policy(offload=["u1"]), big).feasible


def test_compress_time_is_throughput_plus_kernel_launches():
    g = chain()
    sim = Simulator(g, V100)
    sim._compress = (lambda eb, dtype, kind: 5.0, lambda bw, decompress=False, **kw:
                     2e11 if decompress else 1e11, lambda bits, decompress=False: 40.0 + bits,
                     lambda **kw: 0.0)
    tl = sim.result(Strategy.single_device(g).with_policy({"u1": "compress:0.01"})).timeline
    launch = float(V100.devices["launch_overhead"].iloc[0])
    bits = 32 / 5.0
    comp = tl[tl["kind"] == "compress"].iloc[0]
    decomp = tl[tl["kind"] == "decompress"].iloc[0]
    assert comp["bytes"] == decomp["bytes"] == 220
    assert comp["end"] - comp["start"] == pytest.approx(220 / 1e11 + (40 + bits) * launch)
    assert decomp["end"] - decomp["start"] == pytest.approx(220 / 2e11 + (40 + bits) * launch)


def test_recompute_reruns_the_segment_before_its_backward():
    g = chain()
    r = simulate(g, Strategy.single_device(g).with_policy(recompute=["u0", "u1"]), V100)
    tl = r.timeline
    kinds = list(zip(tl["kind"], tl["unit"]))
    i = kinds.index(("recompute", "u0"))
    assert kinds[i + 1] == ("recompute", "u1") and kinds[i + 2] == ("backward", "u1")
    keep = simulate(g, Strategy.single_device(g), V100)
    assert r.iteration_time > keep.iteration_time


def test_data_parallel_allreduce_and_folding():
    g = chain(params=64 << 20)
    c = cluster("4xV100-16GB")
    r = simulate(g, Strategy.data_parallel(g, 4), c)
    tl = r.timeline
    assert (tl["kind"] == "allreduce").sum() >= 2          # DDP buckets
    assert np.allclose(r.peak_memory.to_numpy(), r.peak_memory.iloc[0])
    unfolded = simulate(g, Strategy.data_parallel(g, 4), c, fold=False)
    assert unfolded.iteration_time == r.iteration_time
    assert r.summary().shape[0] == 4
    assert "feasible" in repr(r) and "<table" in r._repr_html_()


def test_captured_model_single_device_matches_estimate():
    import memflow
    g = memflow.zoo.graph("mlp", batch_size=16)
    for optimizer in ("sgd", "adam"):
        r = simulate(g, Strategy.single_device(g), V100, optimizer=optimizer)
        est = estimate(g, "cuda", optimizer=optimizer)
        assert r.peak_memory["gpu0"] == est.loc["total", "at_peak"]
