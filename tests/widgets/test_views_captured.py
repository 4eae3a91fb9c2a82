"""Every view on a model captured from PyTorch by memflow (not a hand-built chain)."""
import pytest

import memflow
from memflow_widgets import MemoryTimeline, StrategyView, Timeline, compare


@pytest.fixture(scope="module")
def captured():
    graph = memflow.zoo.graph("mlp", batch_size=64)
    cluster = memflow.Cluster.preset("2xV100-16GB")
    dp = memflow.Strategy.data_parallel(graph, ["gpu0", "gpu1"])
    mp = memflow.Strategy.model_parallel(graph, ["gpu0", "gpu1"])
    return graph, {"data parallel": memflow.simulate(graph, dp, cluster),
                   "model parallel": memflow.simulate(graph, mp, cluster)}, mp


def test_views_of_a_captured_model(captured):
    graph, results, mp = captured
    view = StrategyView(graph, mp)
    assert list(view.source.data["unit"]) == graph.names
    assert set(view.source.data["device"]) == {"gpu0", "gpu1"}     # model parallel: split
    view.select(graph.names[0])
    assert graph.names[0] in view.details.value
    timeline = Timeline(results["model parallel"])
    assert "transfer" in timeline.sources                          # activations cross GPUs
    memory = MemoryTimeline(results["data parallel"])
    assert all(len(src.data["time"]) for src in memory.sources.values())
    assert set(compare(results).time_source.data["strategy"]) == set(results)
