"""Notebooks as static HTML whose charts draw offline: an nbconvert preprocessor.

A notebook's charts reach a static page two ways, and both fetch JavaScript from the network by
default: a view's widget output (``application/vnd.jupyter.widget-view+json``) is drawn by
ipywidgets' HTML manager, which nbconvert's page loads from unpkg.com; and bokeh's loader
(``memflow_widgets.setup()``'s output, stored in the lessons with BokehJS from its CDN) is what
every bokeh embed on the page waits for. :class:`OfflineCharts` rewrites the notebook on its way
to HTML (the ``.ipynb`` is not changed, so it stays live in JupyterLab):

* the first bokeh loader becomes the installed BokehJS, inlined (about 4 MB); later ones go;
* widget outputs keep only their static fallback (``text/html``: a summary table and a bokeh
  embed of the same chart, see :mod:`memflow_widgets.render`), and the saved widget state is
  dropped, so the page loads no widget manager;
* bokeh's own notebook outputs (``bokeh.io.show``) stay as they are: they draw once BokehJS is
  on the page.

Use it from the command line::

    jupyter nbconvert --to html \\
        --HTMLExporter.preprocessors=memflow_widgets.offline.OfflineCharts tutorials/*.ipynb

>>> import nbformat
>>> nb = nbformat.v4.new_notebook(metadata={"widgets": {}}, cells=[nbformat.v4.new_code_cell(
...     outputs=[nbformat.v4.new_output("display_data", {BOKEH_LOAD: {}, "text/html": "cdn"}),
...              nbformat.v4.new_output("display_data", {WIDGET_VIEW: {}, "text/html": "x"})])])
>>> nb, _ = OfflineCharts().preprocess(nb, {})
>>> [sorted(o.data) for o in nb.cells[0].outputs], "widgets" in nb.metadata
([['text/html'], ['text/html']], False)
>>> "Bokeh" in nb.cells[0].outputs[0].data["text/html"]
True
"""
from __future__ import annotations

from typing import Any

import nbformat
from nbconvert.preprocessors import Preprocessor

__all__ = ["OfflineCharts", "BOKEH_LOAD", "WIDGET_VIEW"]

BOKEH_LOAD = "application/vnd.bokehjs_load.v0+json"
"""The mime type of bokeh's loader output (``output_notebook``, ``memflow_widgets.setup``)."""
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
"""The mime type of a live widget's output."""


def inline_bokehjs() -> str:
    """``<script>`` tags holding the installed BokehJS (every component), for a static page."""
    from bokeh.resources import INLINE

    return INLINE.render_js()


class OfflineCharts(Preprocessor):
    """Make a notebook's charts draw in static HTML without a network (see the module)."""

    def preprocess(self, nb: Any, resources: dict) -> tuple[Any, dict]:
        nb.metadata.pop("widgets", None)
        loaded = False
        for cell in nb.cells:
            if cell.get("cell_type") != "code":
                continue
            outputs = []
            for out in cell.get("outputs", []):
                data = out.get("data", {})
                if BOKEH_LOAD in data:
                    if not loaded:       # BokehJS once, where the notebook first loaded it
                        outputs.append(nbformat.v4.new_output(
                            "display_data", {"text/html": inline_bokehjs()}))
                        loaded = True
                    continue
                if WIDGET_VIEW in data and "text/html" in data:
                    del data[WIDGET_VIEW]
                outputs.append(out)
            cell.outputs = outputs
        return nb, resources
