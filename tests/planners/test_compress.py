"""COMET-style compression planner: strategy, memory, batch adaptation, real measurements."""
import pytest
import torch

import memflow
from memflow.errors import PlanError
from memflow.planners import Infeasible
from memflow.planners.compress import compress, compress_strategy, largest_batch
from memflow.planners.compress_measure import feature_map_ratios, gradient_error
from memflow.planners.batch import graph_source
from memflow.sim.cpu_time import compress_model
from memflow.strategy import Strategy

from .graphs import GIB, chain


def test_strategy_compresses_every_saver():
    g = chain(4)
    s = compress_strategy(g, "1xV100-16GB", error_bound=1e-3)
    assert s.policies == ["compress"] * 4 and list(s.error_bound) == [1e-3] * 4
    with pytest.raises(Infeasible) as err:
        compress_strategy(g, "1xV100-16GB", error_bound=1e-3, memory_limit="0.5GiB")
    assert err.value.min_memory > 0.5 * GIB
    with pytest.raises(PlanError, match="error_bound must be > 0"):
        compress_strategy(g, "1xV100-16GB", error_bound=0)


def test_memory_shrinks_by_the_ratio_and_the_batch_grows():
    g = chain(4)
    t = compress(g, "jetson-nano-4GB", error_bound=[1e-3, 1e-1], measure=False)
    ratio = compress_model()[0]
    for eb in (1e-3, 1e-1):
        # activations held between forward and backward shrink by the simulator's ratio (the
        # largest moment also holds one tensor decompressed for its backward)
        # (a synthetic chain's maps are all signed; a GPU step runs the quantizer)
        assert t.loc[eb, "sim_ratio"] == pytest.approx(ratio(eb, "float32", "signed"))
        assert t.loc[eb, "sim_compressor"] == "quantizer"
        assert 1 < t.loc[eb, "activation_reduction"] <= t.loc[eb, "sim_ratio"]
        assert t.loc[eb, "max_batch"] > t.loc[eb, "max_batch_keep"]
        assert t.loc[eb, "time"] >= t.loc[eb, "time_keep"]
    assert t.loc[1e-1, "max_batch"] >= t.loc[1e-3, "max_batch"]


def test_largest_batch_by_hand():
    # keep-all of chain(4) at batch 8 holds ~4 GiB of activations: 0.5 GiB per sample
    g = chain(4)
    c = memflow.Cluster.preset("1xV100-16GB")
    b = largest_batch(graph_source(g), c, lambda x: Strategy.single_device(x), 3 * GIB, 8)
    peak = lambda k: memflow.simulate(graph_source(g)(k), Strategy.single_device(
        graph_source(g)(k)), c).peak_memory.max()
    assert peak(b) <= 3 * GIB < peak(b + 1)
    assert largest_batch(graph_source(g), c, lambda x: Strategy.single_device(x), 1.0, 8) == 0


def test_measurements_on_a_real_model():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                              torch.nn.Linear(8 * 14 * 14, 10))
    x = torch.randn(16, 3, 16, 16)
    m = feature_map_ratios((net, (x,)), [1e-3, 1e-1])
    assert (m["max_error"] <= m.index.to_series()).all()
    assert m.loc[1e-1, "ratio"] > m.loc[1e-3, "ratio"] > 1
    e = gradient_error((net, (x,)), [1e-4, 1e-2])
    assert e.loc[1e-4, "rel_error"] < e.loc[1e-2, "rel_error"] < 1
    assert e.loc[1e-4, "cosine"] > 0.999
    with pytest.raises(PlanError, match="zoo model name"):
        feature_map_ratios(42, [1e-2])


def test_measured_ratios_say_which_compressor_ran(monkeypatch):
    import sys
    from memflow.compress import sz3
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4))
    source = (net, (torch.randn(128, 64),))
    q = feature_map_ratios(source, [1e-2], compressor="quantizer")
    assert q.loc[1e-2, "compressor"] == "quantizer" and q.loc[1e-2, "max_error"] <= 1e-2
    if sz3.available():     # SZ3 (COMET's compressor) by default, and it packs tighter
        s = feature_map_ratios(source, [1e-2])
        assert s.loc[1e-2, "compressor"] == "sz3" and s.loc[1e-2, "max_error"] <= 1e-2
        assert s.loc[1e-2, "ratio"] > q.loc[1e-2, "ratio"]
    monkeypatch.setitem(sys.modules, "pysz", None)      # without pysz: the quantizer
    assert feature_map_ratios(source, [1e-2]).loc[1e-2, "compressor"] == "quantizer"
