"""compare: bars of step time and per-GPU peak against capacity."""
import pytest

from memflow_widgets import compare
from memflow_widgets.compare import compare_table

from widget_stand_ins import sim_result


def test_bars_per_strategy_and_device(graph, strategy, result):
    big = sim_result(graph, strategy, scale=2.0)
    view = compare({"recompute two": result, "keep all": big})
    assert list(view.time_source.data["strategy"]) == ["recompute two", "keep all"]
    assert list(view.peak_source.data["x"]) == [("gpu0", "recompute two"), ("gpu0", "keep all"),
                                                 ("gpu1", "recompute two"), ("gpu1", "keep all")]
    colors = list(view.time_source.data["color"])
    assert colors[0] != colors[1]                         # the second does not fit
    assert list(view.peak_source.data["capacity"]) == [16.0] * 4
    assert "OUT OF MEMORY" in view.time_source.data["feasible"]


def test_table_and_list_input(result):
    table = compare_table([result, result])
    assert list(table.index) == ["#0", "#1"]
    assert table["feasible"].all()
    assert table.loc["#0", "peak_gpu1"] == result.peak_memory["gpu1"]
    assert "<td>#1</td>" in compare([result, result])._repr_mimebundle_()["text/html"]


def test_nothing_to_compare():
    with pytest.raises(ValueError, match="compare: no results given"):
        compare({})
