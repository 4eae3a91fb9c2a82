"""ComparisonChart: side-by-side bars of step time and per-GPU peak memory for several strategies
(the report compares the plan with data parallel; ``memflow_widgets.compare`` in JupyterLab).

>>> import types
>>> cap = pd.Series([16 * 2**30] * 2, index=["gpu0", "gpu1"])
>>> a = types.SimpleNamespace(iteration_time=0.2, throughput=160.0, capacity=cap, feasible=True,
...                           peak_memory=pd.Series([9 * 2**30, 8 * 2**30], index=cap.index))
>>> b = types.SimpleNamespace(iteration_time=0.3, throughput=107.0, capacity=cap, feasible=False,
...                           peak_memory=pd.Series([17 * 2**30, 3 * 2**30], index=cap.index))
>>> compare_table({"data parallel": a, "recompute": b})["feasible"].tolist()
[True, False]
"""
from __future__ import annotations

import html
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
from bokeh.layouts import row
from bokeh.models import ColumnDataSource, FactorRange, HoverTool
from bokeh.plotting import figure

from ..errors import MemflowError
from .style import (CHART_WIDTH, OOM_COLOR, STRATEGY_PALETTE, format_bytes, format_seconds,
                    memory_scale)

__all__ = ["ComparisonChart", "compare_table", "strategy_colors", "STRATEGY_PALETTE"]



def strategy_colors(names: Sequence[str]) -> dict[str, str]:
    """The colour of each strategy, the same in the time and the memory chart.

    >>> strategy_colors(["data parallel", "plan"])
    {'data parallel': '#1f77b4', 'plan': '#ff7f0e'}
    """
    return {n: STRATEGY_PALETTE[i % len(STRATEGY_PALETTE)] for i, n in enumerate(names)}


def _marks(colors: list[str], over: list[bool]) -> dict[str, list[str]]:
    """The fill, outline and hatch columns of bars: outlined and cross-hatched in red when
    over capacity."""
    return {"color": colors, "line": [OOM_COLOR if o else c for c, o in zip(colors, over)],
            "hatch": ["x" if o else " " for o in over]}


def _named(results: Mapping[str, Any] | Sequence[Any]) -> dict[str, Any]:
    if isinstance(results, Mapping):
        named = {str(k): v for k, v in results.items()}
    else:
        named = {}
        for i, r in enumerate(results):
            name = str(getattr(r, "name", None) or f"#{i}")
            named[name if name not in named else f"{name} #{i}"] = r
    if not named:
        raise MemflowError("compare: no results given; pass a dict {name: SimResult} or a list")
    return named


def compare_table(results: Mapping[str, Any] | Sequence[Any]) -> pd.DataFrame:
    """One row per result: ``time``, ``throughput``, ``max_peak``, ``feasible`` and each
    device's ``peak_<device>``."""
    rows = {}
    for name, r in _named(results).items():
        peak = r.peak_memory.reindex(r.capacity.index).fillna(0.0)
        rows[name] = {"time": float(r.iteration_time), "throughput": float(r.throughput),
                      "max_peak": float(peak.max()), "feasible": bool(r.feasible),
                      **{f"peak_{d}": float(v) for d, v in peak.items()}}
    out = pd.DataFrame.from_dict(rows, orient="index")
    out.index.name = "strategy"
    return out


class ComparisonChart:
    """Two charts: step time per strategy, and peak memory per GPU per strategy against each
    GPU's capacity; each strategy has one colour (:func:`strategy_colors`) in both, and a bar
    that does not fit is outlined and cross-hatched in red. ``root`` is the bokeh row of both.
    """

    def __init__(self, results: Mapping[str, Any] | Sequence[Any], *, width: int = CHART_WIDTH,
                 height: int = 300) -> None:
        self.results = _named(results)
        table = compare_table(self.results)
        names = list(table.index)
        self.colors = strategy_colors(names)
        self.time_source = ColumnDataSource({
            "strategy": names, "time": table["time"].to_numpy() * 1e3,
            **_marks([self.colors[n] for n in names], [not f for f in table["feasible"]]),
            "throughput": table["throughput"].to_numpy(),
            "feasible": ["fits" if f else "OUT OF MEMORY" for f in table["feasible"]]})
        t_fig = figure(x_range=FactorRange(*names), width=max(260, width // 3), height=height,
                       title="step time (ms); red hatch: does not fit", tools="save",
                       toolbar_location=None)
        t_fig.vbar(x="strategy", top="time", width=0.7, fill_color="color", line_color="line",
                   line_width=2, hatch_pattern="hatch", hatch_color=OOM_COLOR, hatch_alpha=0.8,
                   source=self.time_source)
        t_fig.add_tools(HoverTool(tooltips=[("strategy", "@strategy"),
                                            ("time", "@time{0,0.00} ms"),
                                            ("samples/s", "@throughput{0,0.0}"),
                                            ("", "@feasible")]))
        t_fig.xaxis.major_label_orientation = 0.6

        devices = list(dict.fromkeys(str(d) for r in self.results.values()
                                     for d in r.capacity.index))
        factors = [(d, s) for d in devices for s in names]
        peak = [float(self.results[s].peak_memory.get(d, 0.0)) for d, s in factors]
        cap = [float(self.results[s].capacity.get(d, float("nan"))) for d, s in factors]
        unit_name, unit, top = memory_scale(max(peak), float(np.nanmax(cap)))
        shown = [c if c <= top else float("nan") for c in cap]   # capacity off scale: no tick
        marks = _marks([self.colors[s] for _, s in factors],
                       [p > c for p, c in zip(peak, cap)])
        self.peak_source = ColumnDataSource({"x": factors, "peak": np.array(peak) / unit,
                                             "capacity": np.array(shown) / unit, **marks,
                                             "strategy": [s for _, s in factors],
                                             "device": [d for d, _ in factors]})
        p_fig = figure(x_range=FactorRange(*factors), width=width - t_fig.width, height=height,
                       title=f"peak memory per GPU ({unit_name}); black ticks: capacity; "
                       "red hatch: over capacity"
                       + ("" if len(shown) and np.isfinite(shown).all() else
                          f" (off scale: {format_bytes(np.nanmax(cap))})"),
                       tools="save", toolbar_location=None)
        p_fig.vbar(x="x", top="peak", width=0.8, fill_color="color", line_color="line",
                   line_width=2, hatch_pattern="hatch", hatch_color=OOM_COLOR, hatch_alpha=0.8,
                   source=self.peak_source)
        p_fig.scatter(x="x", y="capacity", marker="dash", size=18, line_width=3,
                      color="#000000", source=self.peak_source)
        p_fig.add_tools(HoverTool(tooltips=[("strategy", "@strategy"), ("device", "@device"),
                                            ("peak", f"@peak{{0,0.00}} {unit_name}")]))
        p_fig.xaxis.major_label_orientation = 0.9
        p_fig.y_range.start = 0
        t_fig.y_range.start = 0
        self.time_figure, self.peak_figure = t_fig, p_fig
        self.root = row(t_fig, p_fig)

    def summary_html(self) -> str:
        """Time, throughput, largest peak and fit of each strategy as an HTML table."""
        table = compare_table(self.results)
        rows = "".join(
            f"<tr><td>{html.escape(n)}</td><td>{format_seconds(r.time)}</td>"
            f"<td>{r.throughput:,.1f}</td><td>{format_bytes(r.max_peak)}</td>"
            f"<td>{'yes' if r.feasible else 'no'}</td></tr>" for n, r in table.iterrows())
        return ("<table><tr><th>strategy</th><th>step time</th><th>samples/s</th>"
                f"<th>max peak</th><th>fits</th></tr>{rows}</table>")

