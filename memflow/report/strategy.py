"""StrategyGraph: the graph of units, coloured by device or by memory policy, sized by memory.

Positions come from networkx: ``layered`` puts the units of each topological generation in one
column and folds long models into rows (a snake), so a 200-unit chain stays readable;
``spring`` is networkx's force layout. A unit's size grows with the memory it holds (parameters
plus what it saves for backward). :meth:`StrategyGraph.details_html` gives a unit's numbers
from ``graph.units`` and ``strategy.table`` (``memflow_widgets.StrategyView`` shows them on a
click, with a toggle between colourings).

>>> import memflow
>>> g = memflow.zoo.graph("chain", batch_size=8, n=3, width=16, units="blocks")
>>> view = StrategyGraph(g, memflow.Strategy.single_device(g).with_policy(recompute=["layers.1"]))
>>> list(view.source.data["policy"])
['keep', 'recompute', 'keep']
>>> "<b>layers.1</b>" in view.details_html("layers.1")
True
"""
from __future__ import annotations

import html
from typing import Any, Literal

import networkx as nx
import numpy as np
import pandas as pd
from bokeh.models import ColumnDataSource, HoverTool, LabelSet, Range1d, TapTool, Title
from bokeh.plotting import figure

from ..errors import MemflowError
from ..strategy import POLICIES
from .style import MULTI_DEVICE_COLOR, OTHER_COLOR, color_for, format_bytes, text_width

__all__ = ["StrategyGraph", "layout_positions", "unit_frame", "label_offsets", "plan_cells",
           "NOT_USED"]

NOT_USED = "—"
"""What the strategy table shows where a field does not apply: ``stage`` -1 (no pipeline),
``segment`` -1 (not recomputed), ``error_bound`` NaN (not compressed)."""
LABEL_FONT_PX = 9.33     # 7pt
_LABEL_GAP = 3           # pixels between a node's edge and its label

ColourBy = Literal["device", "policy"]
_DETAIL_COLUMNS = ("kind", "module", "params", "param_bytes", "saved_bytes", "output_bytes",
                   "fwd_tmp_bytes", "bwd_tmp_bytes", "fwd_flops", "bwd_flops")
_PLAN_COLUMNS = ("policy", "error_bound", "devices", "sample", "parameter", "attribute",
                 "stage", "segment", "shard", "offload_optimizer")


def layout_positions(dg: nx.DiGraph, *, layout: str = "layered",
                     wrap: int = 24) -> dict[str, tuple[float, float]]:
    """``(x, y)`` of every node of ``dg``.

    >>> pos = layout_positions(nx.path_graph(5, create_using=nx.DiGraph), wrap=3)
    >>> [pos[n] for n in range(5)]
    [(0.0, 0.0), (1.0, 0.0), (2.0, 0.0), (2.0, -1.5), (1.0, -1.5)]
    """
    if layout == "spring":
        return {n: (float(x), float(y)) for n, (x, y) in nx.spring_layout(dg, seed=0).items()}
    if layout != "layered":
        raise MemflowError(f"layout must be 'layered' or 'spring', got {layout!r}")
    pos: dict[Any, tuple[float, float]] = {}
    for g, nodes in enumerate(nx.topological_generations(dg)):
        row, col = divmod(g, wrap)
        x = float(col if row % 2 == 0 else wrap - 1 - col)  # snake: odd rows run backwards
        for k, n in enumerate(nodes):
            pos[n] = (x, -1.5 * row - 0.5 * (k - (len(nodes) - 1) / 2))
    return pos


def label_offsets(xy: np.ndarray, sizes: np.ndarray, widths: np.ndarray,
                  font_px: float = LABEL_FONT_PX) -> np.ndarray:
    """Vertical offsets (pixels, up) that put each node's label just above or below it, no
    two labels overlapping and no label over another node; NaN for a label that fits on
    neither side (left to the hover).

    ``xy``: the nodes' centres in pixels (y up), ``sizes``: their diameters, ``widths``: their
    labels' widths. Every label above its node when that fits; else, node by node from the
    left, above in even columns and below in odd ones (room for names twice as wide), or on
    the other side when that one is taken.

    >>> xy = np.array([[0.0, 0.0], [40.0, 0.0], [80.0, 0.0]])
    >>> label_offsets(xy, np.full(3, 10.0), np.full(3, 30.0)).tolist()
    [12.665, 12.665, 12.665]
    >>> label_offsets(xy, np.full(3, 10.0), np.full(3, 60.0)).tolist()
    [12.665, -12.665, 12.665]
    >>> label_offsets(xy, np.full(3, 10.0), np.full(3, 100.0)).tolist()
    [12.665, -12.665, nan]
    """
    reach = sizes / 2 + _LABEL_GAP + font_px / 2      # node centre to label centre
    half_w, half_h = widths / 2, font_px / 2 + 1

    def clear(i: int, dy: float, placed: np.ndarray, dys: np.ndarray) -> bool:
        cx, cy = xy[i, 0], xy[i, 1] + dy
        others = np.arange(len(xy)) != i
        node = (np.abs(cx - xy[:, 0]) < half_w[i] + sizes / 2) & \
            (np.abs(cy - xy[:, 1]) < half_h + sizes / 2)
        label = (np.abs(cx - xy[:, 0]) < half_w[i] + half_w) & \
            (np.abs(cy - xy[:, 1] - dys) < 2 * half_h)
        return not (node & others).any() and not (label & placed & others).any()

    everyone = np.ones(len(xy), bool)
    if all(clear(i, reach[i], everyone, reach) for i in range(len(xy))):
        return reach.copy()
    spacing = np.diff(np.unique(np.round(xy[:, 0], 6)))
    column = (np.round((xy[:, 0] - xy[:, 0].min()) / spacing.min()) if len(spacing)
              else np.zeros(len(xy)))
    dys, placed = np.full(len(xy), np.nan), np.zeros(len(xy), bool)
    for i in np.lexsort((-xy[:, 1], xy[:, 0])):
        first = 1.0 if column[i] % 2 == 0 else -1.0
        for side in (first, -first):
            if clear(i, side * reach[i], placed, np.nan_to_num(dys)):
                dys[i], placed[i] = side * reach[i], True
                break
    return dys


_MAX_LABELS = 200   # label_offsets compares every pair of labels
_TOOLBAR_PX, _BORDER_PX, _TITLES_PX = 40, 5, 70   # toolbar; each border; title and caption


def _legend_width(labels: list[str]) -> float:
    """About how wide an 8pt legend of ``labels`` is, outside the plot on its right."""
    return 2 * 10 + 2 * 10 + 20 + 5 + max(text_width(t, 10.67) for t in labels)


def _ranges(xy: np.ndarray, sizes: np.ndarray, widths: np.ndarray,
            frame: tuple[float, float]) -> tuple[Range1d, Range1d, np.ndarray]:
    """x and y ranges leaving room, inside a frame of ``frame`` pixels, for the largest node
    and its label on every side (nothing cut at the edges), and the nodes' centres in pixels."""
    pad = np.array([max(widths.max(initial=0) / 2, sizes.max(initial=0) / 2),
                    sizes.max(initial=0) / 2 + _LABEL_GAP + LABEL_FONT_PX]) + 4
    frame = np.maximum(np.array(frame, dtype=float), 4 * pad)
    lo = xy.min(0) if len(xy) else np.zeros(2)
    span = np.maximum(np.ptp(xy, 0) if len(xy) else np.zeros(2), 1.0)
    per_unit = (frame - 2 * pad) / span                   # pixels per layout unit
    start = lo - (span - (np.ptp(xy, 0) if len(xy) else 0)) / 2 - pad / per_unit
    end = start + frame / per_unit
    xy_px = (xy - start) * per_unit
    return (Range1d(start[0], end[0]), Range1d(start[1], end[1]), xy_px)


def _device_label(devices: Any) -> str:
    parts = list(devices) if isinstance(devices, (list, tuple, np.ndarray)) else [devices]
    names = list(dict.fromkeys(str(d) for d in parts))
    return names[0] if len(names) == 1 else f"{len(names)} devices"


def unit_frame(graph: Any, strategy: Any) -> pd.DataFrame:
    """One row per unit: the graph's numbers and the strategy's choices, with colours.

    Columns added: ``memory`` (parameter + saved bytes), ``device`` (the unit's device, or
    ``"k devices"`` when split), ``device_color`` and ``policy_color``.
    """
    units = graph.units
    plan = strategy.table.set_index("unit")
    missing = [u for u in units.index if u not in plan.index]
    if missing:
        raise MemflowError(f"the strategy has no row for units {missing[:5]} of the graph; was "
                           "it made for another graph?")
    df = units.join(plan[[c for c in _PLAN_COLUMNS if c in plan.columns]])
    df["memory"] = (df["param_bytes"] + df["saved_bytes"]).astype(float)
    df["device"] = df["devices"].map(_device_label)
    devices = sorted({d for d in df["device"] if not d.endswith(" devices")},
                     key=lambda d: (len(d), d))
    df["device_color"] = [color_for(d, devices) if d in devices else MULTI_DEVICE_COLOR
                          for d in df["device"]]
    df["policy_color"] = df["policy"].map(POLICIES.colors).fillna(OTHER_COLOR)
    return df


def plan_cells(plan: dict[str, Any]) -> list[tuple[str, str]]:
    """``(field, text)`` of a unit's strategy fields, :data:`NOT_USED` where one does not apply.

    >>> plan_cells({"policy": "keep", "error_bound": float("nan"), "stage": -1, "segment": 3})
    [('policy', 'keep'), ('error_bound', '—'), ('stage', '—'), ('segment', '3')]
    """
    def text(field: str, value: Any) -> str:
        if field == "error_bound":
            return NOT_USED if pd.isna(value) else f"{value:g}"
        if field in ("stage", "segment"):
            return NOT_USED if int(value) < 0 else str(int(value))
        return str(value)

    return [(f, text(f, v)) for f, v in plan.items()]


class StrategyGraph:
    """The units of ``graph`` placed and coloured by ``strategy`` (``colour_by``: ``"device"``
    or ``"policy"``, :meth:`recolour` switches); ``root`` (also ``figure``) is the bokeh figure.
    """

    def __init__(self, graph: Any, strategy: Any, *, colour_by: ColourBy = "device",
                 layout: str = "layered", wrap: int = 24, width: int = 940,
                 height: int | None = None) -> None:
        self.graph = graph
        self.strategy = strategy
        df = unit_frame(graph, strategy)
        # The topology only (OpGraph.to_networkx would also copy every column and the meta).
        dg = nx.DiGraph()
        dg.add_nodes_from(graph.names)
        dg.add_edges_from(zip(graph.edges["src"], graph.edges["dst"]))
        pos = layout_positions(dg, layout=layout, wrap=wrap)
        xy = np.array([pos[u] for u in df.index], dtype=float).reshape(-1, 2)
        biggest = float(df["memory"].max()) or 1.0
        self.source = ColumnDataSource({
            "unit": df.index.to_numpy(str), "x": xy[:, 0], "y": xy[:, 1],
            "size": 8 + 28 * np.sqrt(df["memory"].to_numpy(float) / biggest),
            "kind": df["kind"].astype(str).to_numpy(),
            "policy": df["policy"].astype(str).to_numpy(),
            "device": df["device"].to_numpy(str),
            "device_color": df["device_color"].to_numpy(str),
            "policy_color": df["policy_color"].to_numpy(str),
            "memory": df["memory"].map(format_bytes).to_numpy(str),
        })
        rows = int(np.ptp(xy[:, 1]) / 1.5) + 1 if len(xy) else 1
        height = height or min(900, 160 + 110 * rows)
        legend_names = [*POLICIES, *df["device"].astype(str)]
        sizes = np.asarray(self.source.data["size"], dtype=float)
        widths = np.array([text_width(u, LABEL_FONT_PX) for u in df.index])
        x_range, y_range, xy_px = _ranges(
            xy, sizes, widths,
            frame=(width - _legend_width(legend_names) - _TOOLBAR_PX, height - _TITLES_PX))
        fig = figure(width=width, height=height, x_range=x_range, y_range=y_range,
                     tools="pan,wheel_zoom,box_zoom,reset,save,tap", title=self._title(),
                     match_aspect=False, min_border=_BORDER_PX)
        fig.axis.visible = False
        fig.grid.visible = False
        where = {u: i for i, u in enumerate(df.index)}
        edges = graph.edges
        fig.multi_line(
            xs=[[xy[where[s], 0], xy[where[d], 0]] for s, d in zip(edges["src"], edges["dst"])],
            ys=[[xy[where[s], 1], xy[where[d], 1]] for s, d in zip(edges["src"], edges["dst"])],
            line_color="#999999", line_alpha=0.6, line_width=1)
        self.nodes = fig.scatter("x", "y", size="size", source=self.source,
                                 fill_color={"field": f"{colour_by}_color"}, line_color="#222222",
                                 legend_field=colour_by, fill_alpha=0.9)
        # names where they fit beside their nodes without overlapping; hover names the rest
        offsets = (label_offsets(xy_px, sizes, widths) if len(df) <= _MAX_LABELS
                   else np.full(len(df), np.nan))
        named = np.isfinite(offsets)
        self.source.data["label"] = np.where(named, df.index.to_numpy(str), "")
        self.source.data["label_dy"] = np.nan_to_num(offsets)
        self.labels = LabelSet(x="x", y="y", text="label", source=self.source,
                               y_offset="label_dy", text_font_size="7pt", text_align="center",
                               text_baseline="middle")
        fig.add_layout(self.labels)
        fig.add_layout(Title(text=f"node area grows with the memory a unit holds (parameters + "
                                  f"saved for backward; largest {format_bytes(df['memory'].max())})"
                                  + ("" if named.all() else "; hover a unit for its name"),
                             text_font_size="8pt", text_font_style="italic",
                             text_color="#555555"), "below")
        fig.add_tools(HoverTool(renderers=[self.nodes], tooltips=[
            ("unit", "@unit"), ("kind", "@kind"), ("policy", "@policy"),
            ("device", "@device"), ("memory", "@memory")]))
        fig.select_one(TapTool).renderers = [self.nodes]
        fig.legend.label_text_font_size = "8pt"
        fig.add_layout(fig.legend[0], "right")
        fig.toolbar.logo = None
        self.figure = self.root = fig

    def _title(self) -> str:
        name = getattr(self.strategy, "name", None) or "strategy"
        model = self.graph.meta.get("model", "model")
        return f"{model}: {len(self.graph)} units — {name}"

    def recolour(self, by: ColourBy) -> None:
        """Colour the units by ``"device"`` or by ``"policy"``."""
        if by not in ("device", "policy"):
            raise MemflowError(f"colour by 'device' or 'policy', got {by!r}")
        self.nodes.glyph.fill_color = {"field": f"{by}_color"}
        self.figure.legend[0].items[0].label = {"field": by}

    def details_html(self, unit: str) -> str:
        """The numbers of ``unit`` (graph and strategy) as an HTML table."""
        if unit not in self.graph.units.index:
            raise MemflowError(f"{unit!r} is not a unit of this graph")
        u = self.graph.units.loc[unit]
        plan = self.strategy.table.set_index("unit").loc[unit]
        cells = [(c, format_bytes(u[c]) if c.endswith("bytes") else
                  f"{u[c] / 1e9:,.3f} GFLOP" if c.endswith("flops") else u[c])
                 for c in _DETAIL_COLUMNS if c in u.index]
        cells += plan_cells({c: plan[c] for c in _PLAN_COLUMNS if c in plan.index})
        rows = "".join(f"<tr><th style='text-align:left'>{html.escape(str(k))}</th>"
                       f"<td>{html.escape(str(v))}</td></tr>" for k, v in cells)
        return f"<b>{html.escape(unit)}</b><table>{rows}</table>"

    def summary_html(self) -> str:
        """The title and the count of each memory policy."""
        table = self.strategy.table
        counts = table["policy"].value_counts().to_dict()
        policies = ", ".join(f"{n} {p}" for p, n in counts.items())
        return f"<p>{html.escape(self._title())}: {html.escape(policies)}.</p>"
