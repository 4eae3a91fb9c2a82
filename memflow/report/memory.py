"""MemoryChart: memory over one simulated step, per device, stacked by category.

``SimResult.memory`` has one row per change of a device's memory (``device``, ``time``,
``bytes`` and one column per category). Memory is constant between changes, so each device is
drawn as a stacked step area; the capacity is a dashed line; hovering shows the task running on
the device at that moment and its unit (joined from ``SimResult.timeline``). The report draws
it as it is; ``memflow_widgets.MemoryTimeline`` shows it live in JupyterLab.

>>> import memflow
>>> g = memflow.zoo.graph("chain", batch_size=8, n=3, width=16)
>>> cluster = memflow.Cluster.preset("2xV100-16GB")
>>> chart = MemoryChart(memflow.simulate(g, memflow.Strategy.data_parallel(g, cluster), cluster))
>>> list(chart.figures), chart.unit_name
(['gpu0', 'gpu1'], 'KiB')
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd
from bokeh.layouts import column, gridplot
from bokeh.models import ColumnDataSource, HoverTool, Range1d, Span
from bokeh.plotting import figure

from ..errors import MemflowError
from .style import (CATEGORIES, CATEGORY_COLORS, CHART_WIDTH, GIB, OOM_COLOR, format_bytes,
                    format_seconds, legend_columns, memory_scale)
from .tasks import per_resource

__all__ = ["MemoryChart", "memory_steps", "categories_of"]

_ROW_COLUMNS = ("time", "total", "task", "unit")


def categories_of(memory: pd.DataFrame) -> list[str]:
    """The memory categories present in ``memory``, in stacking order (bottom first).

    >>> categories_of(pd.DataFrame(columns=["device", "time", "bytes", "activations", "weights"]))
    ['weights', 'activations']
    """
    cats = [c for c in CATEGORIES if c in memory.columns]
    if not cats:
        raise MemflowError("SimResult.memory has none of the category columns "
                         f"{list(CATEGORIES)}; found {list(memory.columns)}")
    return cats


def _with_tasks(memory: pd.DataFrame, timeline: pd.DataFrame | None) -> pd.DataFrame:
    """``memory`` with ``task`` (a label) and ``unit``: of the last compute task started on the
    device by that time."""
    mem = memory.sort_values("time", kind="stable").reset_index(drop=True)
    mem = mem.assign(time=mem["time"].astype(float))
    if timeline is None or timeline.empty:
        return mem.assign(task="", unit="")
    tasks = per_resource(timeline)
    tasks = tasks.loc[tasks["resource"].isin(mem["device"].unique()),
                      ["resource", "start", "label", "unit"]]
    tasks = tasks.assign(start=tasks["start"].astype(float)).sort_values("start", kind="stable")
    out = pd.merge_asof(mem, tasks.rename(columns={"label": "task"}), left_on="time",
                        right_on="start", left_by="device", right_by="resource",
                        direction="backward")
    return out.drop(columns=["resource", "start"]).fillna({"task": "", "unit": ""})


def _decimate(rows: pd.DataFrame, max_points: int) -> pd.DataFrame:
    """At most ~``max_points`` rows, keeping in each time bin the row of highest total memory,
    so that peaks survive the thinning."""
    if len(rows) <= max_points:
        return rows
    t = rows["time"].to_numpy(float)
    span = (t[-1] - t[0]) or 1.0
    bins = np.minimum(((t - t[0]) / span * (max_points - 2)).astype(np.int64), max_points - 3)
    keep = rows.groupby(bins, sort=True)["bytes"].idxmax().to_numpy()
    keep = np.unique(np.concatenate([[rows.index[0]], keep, [rows.index[-1]]]))
    return rows.loc[keep]


def memory_steps(result: Any, *, max_points: int = 4000, devices: Iterable[str] | None = None,
                 unit: float = GIB) -> dict[str, dict[str, np.ndarray]]:
    """Per device, the columns of its stacked step chart (time in ms, memory in ``unit`` bytes).

    Each change of memory becomes two points, at its own time and at the next change, so that
    areas drawn between points are flat steps. Columns: ``time``, one per category, ``total``,
    ``task`` and ``unit``; a device without rows gets empty columns.

    >>> import types
    >>> mem = pd.DataFrame({"device": ["gpu0"] * 2, "time": [0.0, 0.5],
    ...                     "bytes": [2**30, 3 * 2**30], "weights": [2**30] * 2,
    ...                     "activations": [0, 2**30 * 2]})
    >>> res = types.SimpleNamespace(memory=mem, timeline=None, iteration_time=1.0)
    >>> cols = memory_steps(res)["gpu0"]
    >>> cols["time"].tolist(), cols["total"].tolist()
    ([0.0, 500.0, 500.0, 1000.0], [1.0, 1.0, 3.0, 3.0])
    """
    memory = result.memory
    cats = categories_of(memory)
    end = float(result.iteration_time)
    mem = _with_tasks(memory, getattr(result, "timeline", None))
    names = list(devices) if devices is not None else list(dict.fromkeys(mem["device"]))
    out: dict[str, dict[str, np.ndarray]] = {}
    for dev in names:
        rows = _decimate(mem.loc[mem["device"] == dev].reset_index(drop=True), max_points // 2)
        t = rows["time"].to_numpy(float)
        t_next = np.append(t[1:], max(end, t[-1]) if len(t) else end)
        cols = {"time": np.column_stack([t, t_next]).ravel() * 1e3,
                "total": np.repeat(rows["bytes"].to_numpy(float) / unit, 2),
                "task": np.repeat(rows["task"].to_numpy(str), 2),
                "unit": np.repeat(rows["unit"].to_numpy(str), 2)}
        for c in cats:
            cols[c] = np.repeat(rows[c].to_numpy(float) / unit, 2)
        out[dev] = cols
    return out


_LEGEND_FONT_PX = 12      # 9pt


def _legend(cats: list[str], width: int) -> Any:
    """A strip holding only the legend of the categories, above the grid of devices (a legend
    inside one device's chart would hide its data); its items wrap into as many rows as the
    width needs, so none is cut off."""
    labels = [*cats, "capacity"]
    ncols = legend_columns(labels, width, _LEGEND_FONT_PX)
    rows = -(-len(labels) // ncols)
    fig = figure(width=width, height=20 + 23 * rows, toolbar_location=None,
                 outline_line_color=None, x_range=Range1d(0, 1), y_range=Range1d(0, 1),
                 min_border=0)
    fig.axis.visible = False
    fig.grid.visible = False
    for c in cats:
        fig.scatter([-1], [-1], marker="square", size=12, color=CATEGORY_COLORS[c],
                    legend_label=c)
    fig.line([-1, -1], [-1, -1], color=OOM_COLOR, line_dash="dashed", line_width=2,
             legend_label="capacity")
    fig.legend.orientation = "horizontal"
    fig.legend.ncols = ncols
    fig.legend.location = "top_center"
    fig.legend.margin = 0
    fig.legend.border_line_color = None
    fig.legend.label_text_font_size = "9pt"
    return fig


def _scale(result: Any, devices: Iterable[str]) -> tuple[str, float, float]:
    devices = list(devices)
    return memory_scale(max(float(result.peak_memory.get(d, 0.0)) for d in devices),
                        max(float(result.capacity[d]) for d in devices))


def _title(device: str, peak: float, capacity: float) -> str:
    over = "  OUT OF MEMORY" if peak > capacity else ""
    return f"{device}: peak {format_bytes(peak)} of {format_bytes(capacity)}{over}"


class MemoryChart:
    """Memory over time on every device of a simulated step, stacked by category; ``root`` is
    the bokeh layout.

    One small chart per device (shared axes), a dashed line at each device's capacity, and a
    hover that names the running task and its unit. :meth:`update` redraws it for another
    result on the same cluster (the search dashboard does so as the best strategy improves).

    Parameters
    ----------
    result:
        a :class:`memflow.SimResult`.
    devices:
        the devices to draw; default every device of the cluster (``result.capacity.index``).
    max_points:
        at most this many points per device; the thinning keeps peaks.
    width:
        of each device's chart; default: the row of ``ncols`` charts spans ``CHART_WIDTH``
        (800 px). The legend above them wraps into as many rows as that width needs.
    """

    def __init__(self, result: Any, *, devices: Sequence[str] | None = None,
                 max_points: int = 4000, width: int | None = None, height: int = 190,
                 ncols: int = 2) -> None:
        self.result = result
        self.max_points = max_points
        names = list(devices) if devices is not None else [str(d) for d in result.capacity.index]
        if not names:
            raise MemflowError(f"{type(self).__name__}: the result has no devices to draw")
        cats = categories_of(result.memory)
        width = width or CHART_WIDTH // min(ncols, len(names))
        # the unit of the memory axis, kept by update() so that redraws stay comparable
        self.unit_name, self.unit, _ = _scale(result, names)
        self.x_range = Range1d(0, 1)
        self.y_range = Range1d(0, 1)
        self.sources: dict[str, ColumnDataSource] = {}
        self.figures: dict[str, Any] = {}
        self.capacity_spans: dict[str, Span] = {}
        u = self.unit_name
        tooltips = [("time", "@time{0,0.000} ms"), ("memory", f"@total{{0,0.000}} {u}"),
                    ("task", "@task"), ("unit", "@unit"),
                    *[(c, f"@{c}{{0,0.000}} {u}") for c in cats]]
        for i, dev in enumerate(names):
            src = ColumnDataSource({c: [] for c in (*_ROW_COLUMNS, *cats)})
            fig = figure(width=width, height=height, x_range=self.x_range, y_range=self.y_range,
                         x_axis_label="time (ms)" if i >= len(names) - ncols else None,
                         y_axis_label=u if i % ncols == 0 else None,
                         tools="xpan,xwheel_zoom,reset,save", title=dev)
            fig.varea_stack(stackers=cats, x="time", source=src,
                            color=[CATEGORY_COLORS[c] for c in cats], alpha=0.85)
            line = fig.line("time", "total", source=src, color="#222222", line_width=1)
            fig.add_tools(HoverTool(mode="vline", line_policy="prev", renderers=[line],
                                    tooltips=tooltips))
            span = Span(location=0, dimension="width", line_color=OOM_COLOR, line_dash="dashed",
                        line_width=2)
            fig.add_layout(span)
            fig.toolbar.logo = None
            self.sources[dev] = src
            self.figures[dev] = fig
            self.capacity_spans[dev] = span
        grid = gridplot(list(self.figures.values()), ncols=ncols, merge_tools=True)
        self.root = column(_legend(cats, width * min(ncols, len(names))), grid)
        self.update(result)          # drawn before a page model is made: nothing to replay

    def update(self, result: Any) -> None:
        """Draw ``result`` (a SimResult on the same devices) in place of the current one."""
        missing = [d for d in self.sources if d not in result.capacity.index]
        if missing:
            raise MemflowError(f"{type(self).__name__}.update: devices {missing} are not in "
                               f"the new result (it has {list(result.capacity.index)})")
        self.result = result
        steps = memory_steps(result, max_points=self.max_points, devices=self.sources,
                             unit=self.unit)
        for dev, src in self.sources.items():
            cap = float(result.capacity[dev])
            src.data = steps[dev]
            self.capacity_spans[dev].location = cap / self.unit
            self.figures[dev].title.text = _title(dev, float(result.peak_memory.get(dev, 0.0)),
                                                  cap)
        self.x_range.end = float(result.iteration_time) * 1e3 or 1.0
        self.y_range.end = _scale(result, self.sources)[2] / self.unit * 1.08 or 1.0

    def summary_html(self) -> str:
        """Peak, capacity and fit per device as an HTML table."""
        r = self.result
        rows = "".join(
            f"<tr><td>{d}</td><td>{format_bytes(r.peak_memory.get(d, 0.0))}</td>"
            f"<td>{format_bytes(r.capacity[d])}</td>"
            f"<td>{'over' if r.peak_memory.get(d, 0.0) > r.capacity[d] else 'fits'}</td></tr>"
            for d in self.sources)
        return (f"<p>Memory over one step of {format_seconds(r.iteration_time)}.</p>"
                "<table><tr><th>device</th><th>peak</th><th>capacity</th><th></th></tr>"
                f"{rows}</table>")
