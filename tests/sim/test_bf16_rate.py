"""bfloat16 compute is charged at the FP16 rate only on devices with bf16 units."""
import pytest

import memflow
from memflow.search.synthetic import chain_graph
from memflow.sim import Simulator

PRECISIONS = ("fp32", "amp", "bf16", "pure-bf16")


def step_times(gpu: str) -> dict[str, float]:
    g = chain_graph(4, batch=8192, width=2048)       # compute-bound: 2048² matmuls
    cluster = memflow.Cluster.preset(gpu)
    sim, s = Simulator(g, cluster), memflow.Strategy.data_parallel(g, cluster)
    return {p: sim.evaluate(s.with_model_states(precision=p)).iteration_time
            for p in PRECISIONS}


def test_v100_runs_bf16_at_the_fp32_rate():
    """A V100 has FP16 tensor cores but no bf16 ones: amp is fast, bf16 as slow as fp32
    (a little faster: its activations and gradients move half the bytes)."""
    t = step_times("8xV100-16GB")
    for p in ("bf16", "pure-bf16"):
        assert t[p] > 4 * t["amp"], p
        assert 0.95 * t["fp32"] <= t[p] <= t["fp32"], p


@pytest.mark.parametrize("gpu", ["8xA100-80GB", "8xH100-80GB"])
def test_gpus_with_bf16_units_run_it_at_the_fp16_rate(gpu):
    """bf16 computes at amp's rate; it is a little faster for the bytes it halves."""
    t = step_times(gpu)
    for p in ("bf16", "pure-bf16"):
        assert 0.7 * t["amp"] <= t[p] <= t["amp"], p
    assert t["fp32"] > 4 * t["amp"]


def test_units_captured_in_bfloat16_are_bf16_whatever_the_precision():
    """A graph captured under bfloat16 autocast (or a bf16 model) trains in ``amp`` by
    default; its bfloat16 units still have no tensor cores on a V100, float16 ones do."""
    from memflow.graph import OpGraph
    g = chain_graph(4, batch=8192, width=2048)
    t = {}
    for dtype in ("float16", "bfloat16"):
        h = OpGraph(g.units.assign(dtype=dtype), g.tensors, meta=dict(g.meta))
        for gpu in ("8xV100-16GB", "8xA100-80GB"):
            c = memflow.Cluster.preset(gpu)
            t[dtype, gpu] = Simulator(h, c, precision="amp").evaluate(
                memflow.Strategy.data_parallel(h, c)).iteration_time
    assert t["bfloat16", "8xV100-16GB"] > 4 * t["float16", "8xV100-16GB"]
    assert t["bfloat16", "8xA100-80GB"] == t["float16", "8xA100-80GB"]
