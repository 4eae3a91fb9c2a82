"""MemoryTimeline: stacked step areas per device, capacity lines, hover with task and unit."""
import numpy as np
import pandas as pd
import pytest

from memflow_widgets import MemoryTimeline
from memflow_widgets.memory import categories_of, memory_steps
from memflow_widgets.style import GIB

from widget_stand_ins import sim_result


def test_every_device_gets_a_chart_with_its_rows(result):
    view = MemoryTimeline(result)
    assert list(view.sources) == ["gpu0", "gpu1"]
    for dev, src in view.sources.items():
        rows = result.memory[result.memory["device"] == dev]
        assert len(src.data["time"]) == 2 * len(rows)        # two points per change: steps
        assert max(src.data["total"]) == pytest.approx(result.peak_memory[dev] / GIB)
        assert view.capacity_spans[dev].location == pytest.approx(16.0)
    assert view.y_range.end >= 16.0                           # capacity always in view
    assert view.x_range.end == pytest.approx(result.iteration_time * 1e3)


def test_categories_stack_to_the_total(result):
    steps = memory_steps(result)["gpu0"]
    cats = categories_of(result.memory)
    np.testing.assert_allclose(sum(steps[c] for c in cats), steps["total"])


def test_hover_names_the_running_task_and_unit(result):
    data = MemoryTimeline(result).sources["gpu1"].data
    i = list(data["task"]).index("forward layer4 @gpu1")
    assert data["unit"][i] == "layer4"


def test_thinning_keeps_the_peak(result):
    steps = memory_steps(result, max_points=10)["gpu0"]
    assert len(steps["time"]) <= 12
    assert max(steps["total"]) == pytest.approx(result.peak_memory["gpu0"] / GIB)


def test_update_redraws_and_flags_out_of_memory(graph, strategy, result):
    view = MemoryTimeline(result)
    big = sim_result(graph, strategy, scale=2.0)
    view.update(big)
    assert view.result is big
    assert max(view.sources["gpu0"].data["total"]) == pytest.approx(big.peak_memory["gpu0"] / GIB)
    assert "OUT OF MEMORY" in view.figures["gpu0"].title.text
    assert "over" in view.summary_html()


def test_update_with_other_devices_names_them(graph, strategy, result):
    view = MemoryTimeline(result)
    other = sim_result(graph, strategy.with_config(graph.names, sample=1, devices=["gpu7"]))
    with pytest.raises(ValueError, match=r"MemoryTimeline.update: devices \['gpu0', 'gpu1'\]"):
        view.update(other)


def test_missing_categories_are_named(result):
    result.memory = result.memory[["device", "time", "bytes"]]
    with pytest.raises(ValueError, match="MemoryTimeline: SimResult.memory has none"):
        MemoryTimeline(result)


def test_static_picture_carries_numbers_and_embed(result):
    bundle = MemoryTimeline(result)._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    html = bundle["text/html"]
    assert "<td>gpu0</td>" in html and "<script" in html and "fits" in html
