"""ModelStates: the report's model-state table as a widget, redrawn from another result."""
import memflow
from memflow_widgets import ModelStates


def test_model_states_view_follows_the_result_it_is_given(graph):
    two = memflow.Cluster.preset("2xV100-16GB")
    dp = memflow.Strategy.data_parallel(graph, two)
    view = ModelStates(memflow.simulate(graph, dp, two, optimizer="adam"))
    assert "none (DDP)" in view.value and "precision fp32" in view.value
    view.update(memflow.simulate(graph, dp.with_shard("parameters"), two, optimizer="adam"))
    assert "parameters (ZeRO-3 / FSDP)" in view.value and "none (DDP)" not in view.value
