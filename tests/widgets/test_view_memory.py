"""MemoryTimeline on real simulations: stacked step areas, capacity lines, hover task and unit."""
import types

import numpy as np
import pytest

import memflow
from memflow_widgets import MemoryTimeline
from memflow_widgets.memory import categories_of, memory_steps
from memflow_widgets.style import GIB


def test_every_device_gets_a_chart_with_its_rows(result):
    view = MemoryTimeline(result)
    assert list(view.sources) == ["gpu0", "gpu1"]
    assert view.unit_name == "KiB"                            # a small model: KiB, not GiB
    for dev, src in view.sources.items():
        rows = result.memory[result.memory["device"] == dev]
        assert len(src.data["time"]) == 2 * len(rows)        # two points per change: steps
        assert max(src.data["total"]) == pytest.approx(result.peak_memory[dev] / 1024)
        assert view.capacity_spans[dev].location == pytest.approx(16 * 2**20)
    # 16 GiB is far above a peak of KiB: the scale follows the peak, the title gives both
    assert view.y_range.end == pytest.approx(result.peak_memory.max() / 1024 * 1.08)
    assert view.figures["gpu0"].title.text.endswith("of 16.0 GiB")
    assert view.x_range.end == pytest.approx(result.iteration_time * 1e3)


def test_capacity_in_view_when_near_the_peak(oom_result):
    view = MemoryTimeline(oom_result)
    assert view.unit_name == "GiB"
    assert view.capacity_spans["gpu0"].location == pytest.approx(16.0)
    assert view.y_range.end >= max(16.0, oom_result.peak_memory.max() / GIB)


def test_categories_stack_to_the_total(result):
    steps = memory_steps(result)["gpu0"]
    cats = categories_of(result.memory)
    np.testing.assert_allclose(sum(steps[c] for c in cats), steps["total"])


def test_hover_names_the_running_task_and_unit(result):
    data = MemoryTimeline(result).sources["gpu1"].data
    for task, unit in zip(data["task"], data["unit"]):
        if unit:
            assert task.endswith(unit) and task.startswith("#")
    assert any(t.endswith("recompute layer2") for t in data["task"])


def test_thinning_keeps_the_peak(result):
    steps = memory_steps(result, max_points=10)["gpu0"]
    assert len(steps["time"]) <= 12
    assert max(steps["total"]) == pytest.approx(result.peak_memory["gpu0"] / GIB)


def test_update_redraws_and_flags_out_of_memory(result, oom_result):
    view = MemoryTimeline(result)
    assert "OUT OF MEMORY" not in view.figures["gpu0"].title.text
    view.update(oom_result)
    assert view.result is oom_result
    assert max(view.sources["gpu0"].data["total"]) == pytest.approx(   # in the first unit
        oom_result.peak_memory["gpu0"] / 1024)
    assert "OUT OF MEMORY" in view.figures["gpu0"].title.text
    assert view.y_range.end >= 16 * 2**20
    assert "over" in view.summary_html()


def test_update_with_other_devices_names_them(graph, cluster, result):
    view = MemoryTimeline(result)
    other = memflow.simulate(graph, memflow.Strategy.single_device(graph, "gpu1"), cluster)
    with pytest.raises(ValueError, match=r"MemoryTimeline.update: devices \['gpu0'\]"):
        view.update(other)


def test_missing_categories_are_named(result):
    bare = types.SimpleNamespace(memory=result.memory[["device", "time", "bytes"]],
                                 capacity=result.capacity)
    with pytest.raises(ValueError, match="SimResult.memory has none"):
        MemoryTimeline(bare)


def test_static_picture_carries_numbers_and_embed(result):
    bundle = MemoryTimeline(result)._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    html = bundle["text/html"]
    assert "<td>gpu0</td>" in html and "<script" in html and "fits" in html
