"""Where widgets are not live (nbconvert, notebook viewers) the views still show a picture.

A notebook using every view is executed without saving widget state and exported to HTML with
nbconvert, as a person would share it. The export carries each view's numbers as HTML and its
charts as static bokeh embeds; in a real browser (no kernel, no network) the charts draw.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from browser import chromium, lab_page, screenshot, wait_for_ink  # noqa: F401  (fixtures)

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.slow      # runs a notebook in a kernel

CELLS = [f"""
import sys
sys.path.insert(0, {str(HERE)!r})
import memflow
import memflow_widgets as mfw
from widget_helpers import chain_graph
mfw.setup()
graph = chain_graph(8, unit_bytes=2**28)
cluster = memflow.Cluster.preset("2xV100-16GB")
keep = memflow.Strategy.data_parallel(graph, ["gpu0", "gpu1"])
some = keep.with_policy(recompute=["layer2", "layer3"], offload=["layer6"])
result = memflow.simulate(graph, some, cluster)
""", "mfw.MemoryTimeline(result)", "mfw.Timeline(result)", "mfw.StrategyView(graph, some)",
    "mfw.compare({'keep all': memflow.simulate(graph, keep, cluster), 'mixed': result})"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    """The notebook, executed (no widget state saved) and exported to HTML."""
    import nbformat
    from nbclient import NotebookClient
    from nbconvert import HTMLExporter

    folder = tmp_path_factory.mktemp("static")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in CELLS]
    NotebookClient(nb, timeout=180, kernel_name="python3", store_widget_state=False,
                   resources={"metadata": {"path": str(folder)}}).execute()
    html, _ = HTMLExporter().from_notebook_node(nb)
    path = folder / "views.html"
    path.write_text(html)
    return path


def test_export_carries_numbers_and_embeds(exported):
    html = exported.read_text()
    assert html.count("Bokeh.embed.embed_items") >= 4              # one per view
    assert "<td>gpu0</td>" in html and "utilisation" in html       # memory and Gantt tables
    assert "5 keep, 2 recompute, 1 offload" in html
    assert "<td>keep all</td>" in html
    assert "BokehJS" in html or "bokeh-3" in html                  # setup() inlined BokehJS


@pytest.mark.browser
def test_static_pictures_draw_offline(exported, lab_page):
    lab_page.goto(exported.as_uri())
    lab_page.wait_for_function("() => window.Bokeh && Bokeh.documents.length >= 4",
                               timeout=60_000)
    lab_page.wait_for_function(
        "() => Bokeh.documents.every(d => d.roots().length > 0)", timeout=60_000)
    ink = wait_for_ink(lab_page, "body", 20_000)
    assert ink["canvases"] >= 4, ink
    screenshot(lab_page, "static-export")
