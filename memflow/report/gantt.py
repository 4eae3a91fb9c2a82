"""GanttChart: one simulated step — every compute stream and link, every task.

One row per device (its compute stream), per device communication stream and per link or host
used, one bar per task on each resource it occupies, coloured by its kind. Each kind is its own
renderer so clicking its legend entry hides it. The report draws it as it is;
``memflow_widgets.Timeline`` shows it in JupyterLab.

>>> import memflow
>>> g = memflow.zoo.graph("chain", batch_size=8, n=3, width=16)
>>> cluster = memflow.Cluster.preset("2xV100-16GB")
>>> chart = GanttChart(memflow.simulate(g, memflow.Strategy.data_parallel(g, cluster), cluster))
>>> list(reversed(chart.figure.y_range.factors))[:3]
['gpu0', 'gpu1', 'comm:gpu0']
"""
from __future__ import annotations

from typing import Any

import pandas as pd
from bokeh.models import ColumnDataSource, FactorRange, HoverTool
from bokeh.plotting import figure

from ..errors import MemflowError
from .style import CHART_WIDTH, KIND_COLORS, OTHER_COLOR, format_seconds
from .tasks import COMM_PREFIX, per_resource

__all__ = ["GanttChart", "resource_order", "busy_table"]


def resource_order(tasks: pd.DataFrame, devices: list[str]) -> list[str]:
    """Rows top to bottom: each device's compute stream, then the communication streams, then
    links and hosts by first use. ``tasks`` is :func:`~memflow.report.tasks.per_resource`'s.

    >>> tasks = pd.DataFrame({"resource": ["gpu1->gpu0", "comm:gpu1", "gpu1", "gpu0"],
    ...                       "start": [3, 2, 1, 0]})
    >>> resource_order(tasks, ["gpu0", "gpu1"])
    ['gpu0', 'gpu1', 'comm:gpu1', 'gpu1->gpu0']
    """
    used = list(dict.fromkeys(tasks.sort_values("start", kind="stable")["resource"]))
    compute = [d for d in devices if d in used]
    comm = [COMM_PREFIX + d for d in devices if COMM_PREFIX + d in used]
    return compute + comm + [r for r in used if r not in compute and r not in comm]


def busy_table(result: Any) -> pd.DataFrame:
    """Busy time, utilisation (busy / step time) and tasks of each row of the chart."""
    tasks = per_resource(result.timeline)
    busy = (tasks["end"] - tasks["start"]).groupby(tasks["resource"]).sum()
    order = resource_order(tasks, [str(d) for d in result.capacity.index])
    step = float(result.iteration_time) or 1.0
    return pd.DataFrame({"busy": busy, "utilisation": busy / step,
                         "tasks": tasks.groupby("resource").size()}).reindex(order)


class GanttChart:
    """Gantt chart of the compute streams and links of a :class:`memflow.SimResult`; ``root``
    (also ``figure``) is the bokeh figure.

    Hover a bar for its task, kind, unit, times and bytes; click a legend entry to hide a kind.
    """

    def __init__(self, result: Any, *, width: int = CHART_WIDTH, row_height: int = 22) -> None:
        self.result = result
        if result.timeline.empty:
            raise MemflowError(f"{type(self).__name__}: SimResult.timeline is empty; nothing was "
                               "scheduled")
        tl = per_resource(result.timeline)
        resources = resource_order(tl, [str(d) for d in result.capacity.index])
        # tall enough for the legend beside it too: one 20 px entry and 3 px gap per kind,
        # plus the title above it, padding and margins (a sharded step has nine kinds)
        legend = 70 + 23 * tl["kind"].nunique()
        fig = figure(width=width, height=max(80 + row_height * len(resources), legend),
                     y_range=FactorRange(*reversed(resources)), x_axis_label="time (ms)",
                     tools="xpan,xwheel_zoom,box_zoom,reset,save",
                     title=f"one step: {format_seconds(result.iteration_time)}")
        self.sources: dict[str, ColumnDataSource] = {}
        renderers = []
        for kind, rows in tl.groupby("kind", sort=False):
            src = ColumnDataSource({
                "resource": rows["resource"].to_numpy(str),
                "start": rows["start"].to_numpy(float) * 1e3,
                "end": rows["end"].to_numpy(float) * 1e3,
                "task": rows["label"].to_numpy(str),
                "unit": rows["unit"].to_numpy(str),
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
        self.figure = self.root = fig

    def summary_html(self) -> str:
        """Busy time and utilisation of every row as an HTML table."""
        table = busy_table(self.result)
        return (f"<p>One step: {format_seconds(self.result.iteration_time)}.</p>"
                + table.to_html(classes="numbers", border=0, formatters={
                    "busy": format_seconds, "utilisation": "{:.0%}".format}))
