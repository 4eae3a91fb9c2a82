"""HistoryChart: how a search went — the cost of every proposal, the best so far, acceptance.

Input is :attr:`memflow.MCMCSearch.history` (or ``plan/history.csv`` read back): one row per
proposal with ``iteration``, ``cost``, ``best_cost``, ``feasible`` and ``accepted``. Costs are
seconds per step plus the memory penalty, drawn in ms; infinite best costs (before the first
feasible strategy) are left out.

>>> import pandas as pd
>>> h = pd.DataFrame({"iteration": [0, 1, 2], "cost": [0.2, 0.3, 0.1],
...                   "best_cost": [float("inf"), 0.3, 0.1], "feasible": [False, True, True],
...                   "accepted": [True, False, True]})
>>> chart = HistoryChart(h)
>>> chart.best_source.data["best"].tolist(), chart.acceptance_source.data["rate"].tolist()
([300.0, 100.0], [1.0, 0.5, 0.6666666666666666])
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from bokeh.layouts import row
from bokeh.models import ColumnDataSource, HoverTool, Range1d
from bokeh.plotting import figure

from ..errors import MemflowError
from .style import CHART_WIDTH, OOM_COLOR

__all__ = ["HistoryChart", "COLUMNS"]

COLUMNS = ("iteration", "cost", "best_cost", "feasible", "accepted")
_FITS, _BEST = "#4c72b0", "#2ca02c"


class HistoryChart:
    """Cost per proposal (blue: fits, red: out of memory; filled: accepted; a legend says so)
    under a thick green line of the best cost so far, and the acceptance rate over a sliding
    ``window``; ``root`` is the bokeh row.
    At most about ``max_points`` proposals are drawn (every k-th and every improvement).
    """

    def __init__(self, history: pd.DataFrame, *, window: int = 100, max_points: int = 4000,
                 width: int = CHART_WIDTH, height: int = 260) -> None:
        missing = [c for c in COLUMNS if c not in history.columns]
        if missing:
            raise MemflowError(f"search history lacks the columns {missing}; it has "
                               f"{list(history.columns)}")
        if history.empty:
            raise MemflowError("search history is empty: the search made no proposal")
        full = history.reset_index(drop=True)
        self.history = full
        # A long search has millions of proposals; a page draws at most ``max_points`` of them
        # (every k-th, plus each one that improved the best). Rates use every proposal.
        rate_all = full["accepted"].astype(float).rolling(window, min_periods=1).mean()
        best_all = full["best_cost"].to_numpy(float)
        improved = np.flatnonzero(np.r_[True, best_all[1:] != best_all[:-1]])
        stride = max(1, -(-len(full) // max(max_points, 1)))
        rows = np.union1d(np.r_[np.arange(0, len(full), stride), len(full) - 1], improved)
        h = full.iloc[rows]
        feasible = h["feasible"].astype(bool).to_numpy()
        accepted = h["accepted"].astype(bool).to_numpy()
        color = np.where(feasible, _FITS, OOM_COLOR)
        self.cost_source = ColumnDataSource({
            "iteration": h["iteration"].to_numpy(), "cost": h["cost"].to_numpy(float) * 1e3,
            "line": color.tolist(), "fill": np.where(accepted, color, "white").tolist(),
            "state": [("accepted" if a else "rejected") + (", fits" if f else ", OOM")
                      for a, f in zip(accepted, feasible)]})
        steps = np.union1d(improved, [len(full) - 1])
        best = full.iloc[steps[np.isfinite(best_all[steps])]]
        self.best_source = ColumnDataSource({"iteration": best["iteration"].to_numpy(),
                                             "best": best["best_cost"].to_numpy(float) * 1e3})
        self.acceptance_source = ColumnDataSource({"iteration": h["iteration"].to_numpy(),
                                                   "rate": rate_all.to_numpy()[rows]})

        cost = figure(width=width * 2 // 3, height=height, title="cost of each proposal (ms)",
                      x_axis_label="proposal", y_axis_label="ms",
                      tools="xpan,xwheel_zoom,box_zoom,reset,save")
        # one legend item per kind of proposal (grouped in the browser by ``state``)
        dots = cost.scatter("iteration", "cost", source=self.cost_source, size=5,
                            line_color="line", fill_color="fill", alpha=0.6,
                            legend_field="state")
        best_line = cost.step("iteration", "best", source=self.best_source, mode="after",
                              color=_BEST, line_width=3.5, legend_label="best so far")
        cost.scatter("iteration", "best", source=self.best_source, size=7, color=_BEST,
                     legend_label="best so far")
        cost.add_tools(HoverTool(renderers=[dots], tooltips=[
            ("proposal", "@iteration"), ("cost", "@cost{0,0.000} ms"), ("", "@state")]))
        cost.add_tools(HoverTool(renderers=[best_line], tooltips=[
            ("proposal", "@iteration"), ("best so far", "@best{0,0.000} ms")]))
        cost.legend.label_text_font_size = "8pt"
        cost.add_layout(cost.legend[0], "right")
        acc = figure(width=width - cost.width, height=height, x_range=cost.x_range,
                     y_range=Range1d(0, 1.02), title=f"acceptance (last {window} proposals)",
                     x_axis_label="proposal", tools="save")
        acc.line("iteration", "rate", source=self.acceptance_source, color=_FITS, line_width=2)
        for fig in (cost, acc):
            fig.toolbar.logo = None
        self.cost_figure, self.acceptance_figure = cost, acc
        self.root = row(cost, acc)

    def summary_html(self) -> str:
        """Proposals, accepted share, feasible share and the best cost."""
        h = self.history
        best = h["best_cost"].replace(np.inf, np.nan).min()
        best_text = "none fits" if not np.isfinite(best) else f"{best * 1e3:,.2f} ms"
        return (f"<p>{len(h):,} proposals, {h['accepted'].mean():.0%} accepted, "
                f"{h['feasible'].mean():.0%} fit; best {best_text}.</p>")
