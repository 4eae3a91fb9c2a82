"""Timeline: one row per resource, one bar per task, one legend entry per kind."""
import pytest

from memflow_widgets import Timeline
from memflow_widgets.gantt import busy_table, resource_order


def test_rows_are_devices_then_links(result):
    assert resource_order(result) == ["gpu0", "gpu1", "nvlink gpu0", "nvlink gpu1"]
    view = Timeline(result)
    assert list(view.figure.y_range.factors) == ["nvlink gpu1", "nvlink gpu0", "gpu1", "gpu0"]


def test_every_task_is_a_bar_of_its_kind(result):
    view = Timeline(result)
    assert set(view.sources) == {"forward", "backward", "allreduce"}
    assert sum(len(s.data["task"]) for s in view.sources.values()) == len(result.timeline)
    fwd = view.sources["forward"].data
    assert fwd["end"][0] - fwd["start"][0] == pytest.approx(4.0)   # ms
    assert view.figure.legend[0].click_policy == "hide"


def test_busy_table_and_static_picture(result):
    table = busy_table(result)
    assert table.loc["gpu0", "utilisation"] == pytest.approx(1.0)
    assert table.loc["nvlink gpu0", "tasks"] == 1
    assert "utilisation" in Timeline(result)._repr_mimebundle_()["text/html"]


def test_empty_timeline_is_refused(result):
    result.timeline = result.timeline.iloc[:0]
    with pytest.raises(ValueError, match="Timeline: SimResult.timeline is empty"):
        Timeline(result)
