"""Timeline on real simulations: a row per device, comm stream and link; a bar per task."""
import pytest

from memflow_widgets import Timeline
from memflow_widgets.gantt import busy_table
from memflow.report.tasks import per_resource


def test_rows_are_devices_then_the_rest(result):
    view = Timeline(result)
    rows = list(reversed(view.figure.y_range.factors))
    assert rows[:2] == ["gpu0", "gpu1"]
    assert "gpu0->host0" in rows and "host0->gpu1" in rows     # layer5 is offloaded
    assert len(rows) == len(set(rows))


def test_every_task_is_a_bar_on_each_of_its_resources(result):
    view = Timeline(result)
    bars = sum(len(s.data["task"]) for s in view.sources.values())
    assert bars == len(per_resource(result.timeline)) > len(result.timeline)
    assert {"forward", "backward", "recompute", "offload", "prefetch"} <= set(view.sources)
    fwd = view.sources["forward"].data
    assert set(fwd["resource"]) == {"gpu0", "gpu1"}            # folded replicas drawn twice
    assert fwd["task"][0].endswith("forward layer0")
    assert view.figure.legend[0].click_policy == "hide"


def test_busy_table_and_static_picture(result):
    table = busy_table(result)
    assert list(table.index[:2]) == ["gpu0", "gpu1"]
    assert 0 < table.loc["gpu0", "utilisation"] <= 1
    assert table.loc["gpu0", "busy"] == pytest.approx(table.loc["gpu1", "busy"])
    assert "utilisation" in Timeline(result)._repr_mimebundle_()["text/html"]


def test_empty_timeline_is_refused(result):
    result.timeline = result.timeline.iloc[:0]
    with pytest.raises(ValueError, match="Timeline: SimResult.timeline is empty"):
        Timeline(result)
