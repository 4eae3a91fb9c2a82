"""compare on real simulations: bars of step time and per-GPU peak against capacity."""
import pytest

from memflow_widgets import compare
from memflow_widgets.compare import compare_table


def test_bars_per_strategy_and_device(result, oom_result):
    view = compare({"fits": result, "too big": oom_result})
    assert list(view.time_source.data["strategy"]) == ["fits", "too big"]
    assert list(view.peak_source.data["x"]) == [("gpu0", "fits"), ("gpu0", "too big"),
                                                 ("gpu1", "fits"), ("gpu1", "too big")]
    colors = list(view.time_source.data["color"])
    assert colors[0] != colors[1]
    assert list(view.time_source.data["feasible"]) == ["fits", "OUT OF MEMORY"]
    assert list(view.peak_source.data["capacity"]) == [pytest.approx(16.0)] * 4   # GiB


def test_capacity_far_above_the_peaks_is_off_scale(result):
    view = compare([result])
    assert all(c != c for c in view.peak_source.data["capacity"])      # NaN: no tick drawn
    assert view.peak_figure.title.text.endswith("(off scale: 16.0 GiB)")
    peak_kib = result.peak_memory["gpu0"] / 1024
    assert view.peak_source.data["peak"][0] == pytest.approx(peak_kib)


def test_table_and_list_input(result):
    table = compare_table([result, result])
    assert list(table.index) == ["#0", "#1"]
    assert table["feasible"].all()
    assert table.loc["#0", "peak_gpu1"] == result.peak_memory["gpu1"]
    assert table.loc["#0", "time"] == result.iteration_time
    assert "<td>#1</td>" in compare([result, result])._repr_mimebundle_()["text/html"]


def test_nothing_to_compare():
    with pytest.raises(ValueError, match="compare: no results given"):
        compare({})
