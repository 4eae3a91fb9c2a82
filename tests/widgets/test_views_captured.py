"""Every view on a model captured from PyTorch by memflow (not a hand-built chain)."""
import pytest

import memflow
from memflow_widgets import MemoryTimeline, StrategyView, Timeline, compare
from memflow_widgets.export_panel import ExportPanel

pytestmark = pytest.mark.slow      # imports torch and captures a model


@pytest.fixture(scope="module")
def captured():
    graph = memflow.zoo.graph("mlp", batch_size=64)
    cluster = memflow.Cluster.preset("2xV100-16GB")
    dp = memflow.Strategy.data_parallel(graph, ["gpu0", "gpu1"])
    mp = memflow.Strategy.model_parallel(graph, ["gpu0", "gpu1"])
    return graph, cluster, {"data parallel": memflow.simulate(graph, dp, cluster),
                   "model parallel": memflow.simulate(graph, mp, cluster)}, mp


def test_views_of_a_captured_model(captured):
    graph, _, results, mp = captured
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


def test_export_script_of_the_best_strategy(captured, tmp_path):
    graph, cluster, _, _ = captured
    search = memflow.MCMCSearch(graph, cluster, seed=0).step(20)
    panel = ExportPanel(search, path=str(tmp_path / "plan.json"))
    assert panel.model.value == "mlp"                      # the zoo name, from the capture
    script = panel.export_script()
    assert script == tmp_path / "plan.py" and "wrote" in panel.status.value
    assert "MODEL = 'mlp'" in script.read_text()
    assert memflow.Strategy.from_json(tmp_path / "plan.json") == search.best
