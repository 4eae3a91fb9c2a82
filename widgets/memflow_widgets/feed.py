"""HistoryFeed: new rows of a search's history → column batches for ``ColumnDataSource.stream``.

Each stream call costs several comm messages, so the dashboard sends one batch per flush
(~0.2 s), not one per proposal. A fast search makes thousands of proposals per second; the feed
keeps every ``stride``-th iteration and doubles the stride whenever the chart holds more than
``max_points`` points, so the charts cover the whole run with a bounded number of points. The
acceptance rate is a rolling mean over the last ``window`` proposals, computed on every row
(thinning happens after). Widget-free: tested without a browser.

>>> feed = HistoryFeed(window=2)
>>> rows = pd.DataFrame({"iteration": [0, 1, 2], "cost": [3.0, 2.0, 2.5],
...                      "best_cost": [3.0, 2.0, 2.0], "accepted": [True, True, False]})
>>> batch = feed.take(rows)
>>> batch["acceptance"]["rate"].tolist()
[1.0, 1.0, 0.5]
>>> feed.take(rows.iloc[:0]) is None
True
"""
from __future__ import annotations

import numpy as np
import pandas as pd

__all__ = ["HistoryFeed", "HISTORY_COLUMNS"]

HISTORY_COLUMNS = ("iteration", "cost", "best_cost", "accepted")
Batch = dict[str, dict[str, np.ndarray]]


class HistoryFeed:
    """Turns successive slices of ``MCMCSearch.history`` into stream batches.

    ``take(rows)`` expects the rows not given before, in order; :attr:`seen` counts the rows
    taken so far (the caller slices the history from there).
    """

    def __init__(self, *, window: int = 200, max_points: int = 2000) -> None:
        if window < 1 or max_points < 2:
            raise ValueError(f"HistoryFeed: window must be >= 1 and max_points >= 2; "
                             f"got window={window}, max_points={max_points}")
        self.window = window
        self.max_points = max_points
        self.seen = 0
        self.stride = 1
        self.points = 0                      # points streamed so far
        self.best_cost = float("nan")        # of the last row taken (thinning may drop it)
        self._tail = np.empty(0)             # accepted flags of the last `window` rows

    def take(self, rows: pd.DataFrame) -> Batch | None:
        """The batch for ``rows`` (new history rows), or None when there are none.

        Keys: ``"cost"`` → ``iteration``, ``cost``, ``best_cost`` (infinite costs become NaN,
        drawn as gaps); ``"acceptance"`` → ``iteration``, ``rate``.
        """
        missing = [c for c in HISTORY_COLUMNS if c not in rows.columns]
        if missing:
            raise ValueError(f"HistoryFeed: search history lacks columns {missing}; "
                             f"it has {list(rows.columns)}")
        if rows.empty:
            return None
        self.seen += len(rows)
        self.best_cost = float(rows["best_cost"].iloc[-1])
        accepted = rows["accepted"].to_numpy(dtype=float)
        flags = np.concatenate([self._tail, accepted])
        csum = np.concatenate([[0.0], np.cumsum(flags)])
        end = np.arange(len(self._tail) + 1, len(flags) + 1)
        start = np.maximum(end - self.window, 0)
        rate = (csum[end] - csum[start]) / (end - start)
        self._tail = flags[-self.window:]

        iteration = rows["iteration"].to_numpy(dtype=np.int64)
        keep = np.flatnonzero(iteration % self.stride == 0)
        if keep.size == 0:
            return None
        self.points += keep.size
        while self.points > self.max_points * (1 + np.log2(self.stride)):
            self.stride *= 2                     # older points stay denser: the run's start
        cost = np.where(np.isfinite(rows["cost"].to_numpy(float)), rows["cost"], np.nan)
        best = np.where(np.isfinite(rows["best_cost"].to_numpy(float)), rows["best_cost"],
                        np.nan)
        return {"cost": {"iteration": iteration[keep], "cost": cost[keep],
                         "best_cost": best[keep]},
                "acceptance": {"iteration": iteration[keep], "rate": rate[keep]}}
