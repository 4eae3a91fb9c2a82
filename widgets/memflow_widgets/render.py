"""How views reach the page: BokehJS loaded inline, live widgets, and a static fallback.

Every view is an ipywidgets box around one or more bokeh layouts (through jupyter_bokeh's
``BokehModel``, as :class:`Chart`). When widgets are live (JupyterLab, Voila) the widget view
is drawn; when they are not (nbconvert, a notebook viewer), the same display also carries
``text/html``: a short table of the numbers that matter plus a static bokeh embed of the same
charts, which draws wherever BokehJS was loaded by :func:`setup` earlier in the notebook.
"""
from __future__ import annotations

from typing import Any

import ipywidgets
from bokeh.models import LayoutDOM
from jupyter_bokeh import BokehModel
from memflow.report.page import static_components

__all__ = ["setup", "static_html", "Chart", "StaticFallback", "BokehView"]


def setup(*, banner: bool = False) -> None:
    """Load BokehJS into the notebook from the installed bokeh, so charts draw offline.

    Call it once per notebook, before the first view. Bokeh's default loads BokehJS from a CDN,
    which fails silently without a network; this inlines it instead. Its output also carries
    BokehJS into notebooks exported by nbconvert, where the views' static embeds need it.
    """
    from bokeh.io import output_notebook
    from bokeh.resources import INLINE

    output_notebook(resources=INLINE, hide_banner=not banner)


def static_html(root: LayoutDOM, summary: str = "") -> str:
    """``summary`` (HTML shown even where scripts do not run) followed by a bokeh embed of ``root``.

    >>> from bokeh.plotting import figure
    >>> html = static_html(figure(), "<p>numbers</p>")
    >>> html.startswith("<div><p>numbers</p>") and "<script" in html
    True
    """
    script, divs = static_components({"root": root})
    div = divs["root"]
    return f"<div>{summary}{div}{script}</div>"


class Chart(BokehModel):
    """jupyter_bokeh's ``BokehModel`` without the page's echo.

    While the page applies a change sent from the kernel, jupyter_bokeh 4.1 queues the events
    that applying it raises and then sends them back, so every streamed row would be appended
    a second time on the kernel's side (and every redraw sent back whole). Only what a person
    does on the page comes back here: selections (a click on a glyph) and bokeh's UI events.
    """

    def _sync_model(self, model: BokehModel, content: dict[str, Any],
                    buffers: list[Any]) -> None:
        kind = content.get("kind")
        if content.get("event") == "jsevent" and (
                kind in ("ColumnsStreamed", "ColumnsPatched")
                or (kind == "ModelChanged" and content.get("attr") != "indices")):
            return
        super()._sync_model(model, content, buffers)


class StaticFallback:
    """Mixin for widgets holding bokeh charts.

    On display, the charts are re-serialized (:meth:`refresh`): a ``BokehModel``'s page view
    starts from the document as it was when the model was made, and changes made while no view
    was on the page are not replayed, so without this a view shown after an update would show
    stale charts. The display also carries ``text/html`` from :meth:`static_html`, which
    notebook viewers and nbconvert show when no widget state is saved.
    """

    def charts(self) -> list[tuple[BokehModel, LayoutDOM]]:
        """The ``(BokehModel, bokeh root)`` pairs this widget shows."""
        raise NotImplementedError

    def static_html(self) -> str:
        """A static picture of the widget as HTML."""
        raise NotImplementedError

    def refresh(self) -> None:
        """Bring every page view of the charts up to the current state of their documents."""
        for chart, root in self.charts():
            chart.update_from_model(root)

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        self.refresh()
        data = super()._repr_mimebundle_(**kwargs)  # type: ignore[misc]
        data["text/html"] = self.static_html()
        return data


class BokehView(StaticFallback, ipywidgets.VBox):
    """A box whose first child draws the bokeh layout ``root``; ``controls`` follow below it.

    Subclasses keep references to memflow objects and to bokeh/ipywidgets models only, and give
    :meth:`summary_html` for the static fallback.
    """

    def __init__(self, root: LayoutDOM, controls: tuple[ipywidgets.Widget, ...] = (),
                 **kwargs: Any) -> None:
        self.root = root
        self.chart = Chart(root)
        super().__init__([self.chart, *controls], **kwargs)
        self.add_class(f"memflow-{type(self).__name__.lower()}")   # a handle for page tests

    def summary_html(self) -> str:
        """A small HTML table of this view's key numbers (shown where charts cannot draw)."""
        return ""

    def charts(self) -> list[tuple[BokehModel, LayoutDOM]]:
        return [(self.chart, self.root)]

    def close(self) -> None:
        """Close this view and the widgets it made (its chart and controls)."""
        for child in self.children:
            if isinstance(child, BokehModel):
                # BokehModel.close() also unhooks the bokeh document and raises when called a
                # second time, as Widget.__del__ does at collection: close the widget part
                # only here; the unhooking happens once, at collection.
                ipywidgets.DOMWidget.close(child)
            else:
                child.close()
        super().close()

    def static_html(self) -> str:
        return static_html(self.root, self.summary_html())
