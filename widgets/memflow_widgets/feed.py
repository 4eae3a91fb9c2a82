"""ProgressFeed: the search's progress as chart rows, one per flush, for ``ColumnDataSource.stream``.

Each stream call costs several comm messages, and reading a long history costs time in
proportion to its length, so the live charts do not replay the history: every flush (~0.2 s)
adds one point sampled from the search's counters — iteration, the chain's current cost, the
best cost, and the acceptance rate over the last ``window`` proposals. A fast search thus draws
a few points a second however many proposals it makes, and a flush costs the same after a
million iterations as after ten. Widget-free: tested without a browser.

>>> class Search:                                  # the counters an MCMCSearch has
...     iteration, current_cost, best_cost = 3, 2.5, float("inf")
...     def acceptance_rate(self, window): return 2 / 3
>>> feed = ProgressFeed(window=100)
>>> row = feed.take(Search())
>>> row["iteration"], row["cost"], row["rate"]
([3], [2.5], [0.6666666666666666])
>>> row["best_cost"][0] != row["best_cost"][0]      # infinite (nothing feasible yet): a gap
True
>>> feed.take(Search()) is None                    # no new proposal since: no new point
True
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["ProgressFeed", "COLUMNS", "replay"]

COLUMNS = ("iteration", "cost", "best_cost", "rate")


def _finite(x: float) -> float:
    x = float(x)
    return x if math.isfinite(x) else math.nan


class ProgressFeed:
    """Samples ``search`` (``iteration``, ``current_cost``, ``best_cost``,
    ``acceptance_rate(window)``) into one chart row per call, when it moved."""

    def __init__(self, *, window: int = 200) -> None:
        if window < 1:
            raise ValueError(f"ProgressFeed: window must be >= 1, got {window}")
        self.window = window
        self.iteration = -1          # of the last row given

    def take(self, search: Any) -> dict[str, list[float]] | None:
        """The row for the search's present state (columns :data:`COLUMNS`), or None when it
        made no proposal since the last row. Infinite costs become NaN (drawn as gaps)."""
        it = int(search.iteration)
        if it == self.iteration:
            return None
        self.iteration = it
        return {"iteration": [it], "cost": [_finite(search.current_cost)],
                "best_cost": [_finite(search.best_cost)],
                "rate": [_finite(search.acceptance_rate(self.window))]}


def replay(history: pd.DataFrame, *, window: int = 200, points: int = 400) -> dict[str, Any]:
    """Chart rows (columns :data:`COLUMNS`) for proposals a search made before its dashboard
    was shown, from its ``history`` frame: at most ``points`` rows, evenly spaced, the last
    proposal always among them. Read once, when a dashboard opens on a search that already
    ran, so that its charts do not start at the present with one point.

    The chain's cost is the last accepted proposal's (NaN before the first acceptance); the
    rate is the share accepted over the ``window`` proposals up to each row, as the live feed's.

    >>> h = pd.DataFrame({"iteration": [0, 1, 2, 3], "cost": [4.0, 3.0, 5.0, 2.0],
    ...                   "accepted": [True, True, False, True],
    ...                   "best_cost": [4.0, 3.0, 3.0, 2.0]})
    >>> rows = replay(h, window=2, points=3)
    >>> rows["iteration"].tolist(), rows["cost"].tolist(), rows["rate"].tolist()
    ([0, 2, 3], [4.0, 3.0, 2.0], [1.0, 0.5, 0.5])
    """
    if points < 1:
        raise ValueError(f"replay: points must be >= 1, got {points}")
    accepted = history["accepted"].astype(float)
    chain = history["cost"].where(history["accepted"]).ffill()
    rate = accepted.rolling(window, min_periods=1).mean()
    n = len(history)
    pick = np.unique(np.linspace(0, n - 1, min(n, points)).round().astype(np.int64))
    finite = lambda col: np.where(np.isfinite(col), col, np.nan)   # noqa: E731 - inf: a gap
    return {"iteration": history["iteration"].to_numpy(np.int64)[pick],
            "cost": finite(chain.to_numpy(float)[pick]),
            "best_cost": finite(history["best_cost"].to_numpy(float)[pick]),
            "rate": rate.to_numpy(float)[pick]}
