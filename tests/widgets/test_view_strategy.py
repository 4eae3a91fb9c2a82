"""StrategyView: layout from networkx, colour toggles, a click shows a unit's numbers."""
import networkx as nx
import pytest

from memflow_widgets import StrategyView
from memflow_widgets.strategy_view import layout_positions
from memflow.strategy import POLICIES
from memflow_widgets.style import MULTI_DEVICE_COLOR


def test_nodes_are_units_sized_by_memory(graph, strategy):
    view = StrategyView(graph, strategy)
    data = view.source.data
    assert list(data["unit"]) == graph.names
    sizes = list(data["size"])
    assert sizes == sorted(sizes)                    # later units save more in this chain
    assert set(data["device"]) == {"2 devices"}      # data parallel: every unit on both GPUs
    assert set(data["device_color"]) == {MULTI_DEVICE_COLOR}


def test_colour_toggle_switches_fill_and_legend(graph, strategy):
    view = StrategyView(graph, strategy)
    assert view.nodes.glyph.fill_color.field == "device_color"
    view.colour_by.value = "policy"
    assert view.nodes.glyph.fill_color.field == "policy_color"
    assert view.figure.legend[0].items[0].label.field == "policy"
    i = graph.names.index("layer2")
    assert view.source.data["policy_color"][i] == POLICIES.colors["recompute"]
    view.colour_by.value = "device"
    assert view.nodes.glyph.fill_color.field == "device_color"


def test_a_click_shows_the_units_numbers(graph, strategy):
    view = StrategyView(graph, strategy)
    # What a click in the browser sends back: the source's selection changes.
    view.source.selected.indices = [graph.names.index("layer5")]
    assert "<b>layer5</b>" in view.details.value
    assert "offload" in view.details.value and "6.00 KiB" in view.details.value
    view.select("layer2")
    assert "<b>layer2</b>" in view.details.value and "recompute" in view.details.value
    view.source.selected.indices = []
    assert "click a unit" in view.details.value
    with pytest.raises(ValueError, match="StrategyView.select: 'nope'"):
        view.select("nope")


def test_devices_colour_single_device_units(graph, strategy):
    placed = strategy.with_config(graph.names[:5], sample=1, devices=["gpu1"])
    data = StrategyView(graph, placed).source.data
    assert data["device"][0] == "gpu1" and data["device"][9] == "2 devices"
    assert data["device_color"][0] != MULTI_DEVICE_COLOR


def test_strategy_for_another_graph_is_named(graph, strategy):
    from widget_helpers import chain_graph
    with pytest.raises(ValueError, match="no row for units .*layer10"):
        StrategyView(chain_graph(12), strategy)


def test_layouts():
    dg = nx.DiGraph([("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")])
    pos = layout_positions(dg)
    assert pos["b"][0] == pos["c"][0] == 1.0 and pos["b"][1] != pos["c"][1]
    assert set(layout_positions(dg, layout="spring")) == set(dg)
    with pytest.raises(ValueError, match="layout must be 'layered' or 'spring'"):
        layout_positions(dg, layout="circle")


def test_static_picture(graph, strategy):
    html = StrategyView(graph, strategy)._repr_mimebundle_()["text/html"]
    assert "7 keep, 2 recompute, 1 offload" in html and "<script" in html


def test_the_page_sends_clicks_but_its_echo_is_dropped(graph, strategy):
    """What the page sends back: a selection (a click) reaches the view; the echo of a change
    the kernel made (here a stream of rows) does not come back as a second copy."""
    view = StrategyView(graph, strategy)
    selected = view.source.selected
    view.chart._sync_model(view.chart, {"event": "jsevent", "kind": "ModelChanged",
                                        "model": {"id": selected.id}, "attr": "indices",
                                        "new": [4]}, [])
    assert "<b>layer4</b>" in view.details.value
    rows = len(view.source.data["unit"])
    view.chart._sync_model(view.chart, {"event": "jsevent", "kind": "ColumnsStreamed",
                                        "model": {"id": view.source.id},
                                        "data": {"type": "map", "entries": []},
                                        "rollover": None}, [])
    view.chart._sync_model(view.chart, {"event": "jsevent", "kind": "ModelChanged",
                                        "model": {"id": view.figure.title.id}, "attr": "text",
                                        "new": "echoed"}, [])
    assert len(view.source.data["unit"]) == rows and view.figure.title.text != "echoed"
