"""Timeline: a Gantt chart of one simulated step — every compute stream and link, every task.

One row per resource of ``SimResult.timeline`` (devices first, in the cluster's order, then
links and hosts in order of first use), one bar per task coloured by its kind. Each kind is its
own renderer so clicking its legend entry hides it.
"""
from __future__ import annotations

from typing import Any

import pandas as pd
from bokeh.models import ColumnDataSource, FactorRange, HoverTool
from bokeh.plotting import figure

from .render import BokehView
from .style import KIND_COLORS, OTHER_COLOR, fmt_seconds

__all__ = ["Timeline", "resource_order", "busy_table"]


def resource_order(result: Any) -> list[str]:
    """Resources of ``result.timeline`` top to bottom: its devices, then the others by first use.

    >>> import types
    >>> tl = pd.DataFrame({"resource": ["link:gpu1-gpu0", "gpu1", "gpu0"], "start": [2, 1, 0]})
    >>> cap = pd.Series([1, 1], index=["gpu0", "gpu1"])
    >>> resource_order(types.SimpleNamespace(timeline=tl, capacity=cap))
    ['gpu0', 'gpu1', 'link:gpu1-gpu0']
    """
    used = result.timeline.sort_values("start", kind="stable")["resource"].astype(str)
    used = list(dict.fromkeys(used))
    devices = [str(d) for d in result.capacity.index if str(d) in used]
    return devices + [r for r in used if r not in devices]


def busy_table(result: Any) -> pd.DataFrame:
    """Busy time and utilisation (busy / step time) of each resource, in drawing order."""
    tl = result.timeline
    busy = (tl["end"] - tl["start"]).groupby(tl["resource"].astype(str)).sum()
    busy = busy.reindex(resource_order(result))
    step = float(result.iteration_time) or 1.0
    return pd.DataFrame({"busy": busy, "utilisation": busy / step,
                         "tasks": tl.groupby(tl["resource"].astype(str)).size()})


class Timeline(BokehView):
    """Gantt chart of the compute streams and links of a :class:`memflow.SimResult`.

    Hover a bar for its task, kind, unit, times and bytes; click a legend entry to hide a kind.
    """

    def __init__(self, result: Any, *, width: int = 940, row_height: int = 22) -> None:
        self.result = result
        tl = result.timeline
        if tl.empty:
            raise ValueError("Timeline: SimResult.timeline is empty; nothing was scheduled")
        resources = resource_order(result)
        fig = figure(width=width, height=80 + row_height * len(resources),
                     y_range=FactorRange(*reversed(resources)), x_axis_label="time (ms)",
                     tools="xpan,xwheel_zoom,box_zoom,reset,save",
                     title=f"one step: {fmt_seconds(result.iteration_time)}")
        self.sources: dict[str, ColumnDataSource] = {}
        renderers = []
        for kind, rows in tl.groupby("kind", sort=False):
            src = ColumnDataSource({
                "resource": rows["resource"].astype(str).to_numpy(),
                "start": rows["start"].to_numpy(float) * 1e3,
                "end": rows["end"].to_numpy(float) * 1e3,
                "task": rows["task"].astype(str).to_numpy(),
                "unit": rows["unit"].fillna("").astype(str).to_numpy(),
                "bytes": rows["bytes"].fillna(0).to_numpy(float),
            })
            renderers.append(fig.hbar(y="resource", left="start", right="end", height=0.8,
                                      source=src, color=KIND_COLORS.get(kind, OTHER_COLOR),
                                      legend_label=str(kind)))
            self.sources[str(kind)] = src
        fig.add_tools(HoverTool(renderers=renderers, tooltips=[
            ("task", "@task"), ("unit", "@unit"), ("on", "@resource"),
            ("start", "@start{0,0.000} ms"), ("end", "@end{0,0.000} ms"),
            ("bytes", "@bytes{0,0}")]))
        fig.legend.click_policy = "hide"
        fig.legend.location = "top_right"
        fig.legend.label_text_font_size = "8pt"
        fig.add_layout(fig.legend[0], "right")
        fig.toolbar.logo = None
        self.figure = fig
        super().__init__(fig)

    def summary_html(self) -> str:
        table = busy_table(self.result)
        return (f"<p>One step: {fmt_seconds(self.result.iteration_time)}.</p>"
                + table.to_html(formatters={"busy": fmt_seconds,
                                            "utilisation": "{:.0%}".format}))
