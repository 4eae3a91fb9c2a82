"""The search history: one row per proposal, kept in lists, a DataFrame on access.

Columns (``docs/data-model.md``, "Search history"): ``iteration``, ``move``, ``unit``,
``cost``, ``time``, ``peak`` (max over devices), ``peak_<device>`` per device, ``feasible``,
``accepted``, ``best_cost``, ``elapsed`` (seconds of search so far). The frame is rebuilt only
for rows added since the last access, so a dashboard that reads it every few hundred steps pays
for the new rows only.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from ..errors import FileFormatError
from .cost import Score

__all__ = ["History", "COLUMNS"]

COLUMNS = ("iteration", "move", "unit", "cost", "time", "peak", "feasible", "accepted",
           "best_cost", "elapsed")
_SCALARS = ("iteration", "move", "unit", "cost", "time", "feasible", "accepted", "best_cost",
            "elapsed")


class History:
    """Rows of a chain, appended one per proposal.

    >>> import numpy as np
    >>> h = History(["gpu0", "gpu1"])
    >>> h.append(0, "policy", "fc", Score(2.0, 1.5, np.array([3.0, 4.0]), True), True, 2.0, 0.1)
    >>> h.frame[["iteration", "peak", "peak_gpu1", "best_cost"]]
       iteration  peak  peak_gpu1  best_cost
    0          0   4.0        4.0        2.0
    >>> h.acceptance_rate()
    1.0
    """

    def __init__(self, devices: Sequence[str]):
        self.devices = [str(d) for d in devices]
        self.rows: dict[str, list] = {c: [] for c in _SCALARS}
        self.peaks: list[np.ndarray] = []
        self._frame: pd.DataFrame | None = None

    def __len__(self) -> int:
        return len(self.rows["iteration"])

    def append(self, iteration: int, move: str, unit: str, score: Score, accepted: bool,
               best_cost: float, elapsed: float) -> None:
        """Add the row of one proposal."""
        r = self.rows
        r["iteration"].append(int(iteration))
        r["move"].append(move)
        r["unit"].append(unit)
        r["cost"].append(score.cost)
        r["time"].append(score.time)
        r["feasible"].append(bool(score.feasible))
        r["accepted"].append(bool(accepted))
        r["best_cost"].append(float(best_cost))
        r["elapsed"].append(float(elapsed))
        self.peaks.append(score.peak)

    def _build(self, lo: int, hi: int) -> pd.DataFrame:
        peaks = (np.vstack(self.peaks[lo:hi]) if hi > lo
                 else np.zeros((0, len(self.devices))))
        cols: dict[str, Any] = {}
        for c in COLUMNS:
            if c == "peak":
                cols["peak"] = peaks.max(axis=1, initial=0.0)
                for j, d in enumerate(self.devices):
                    cols[f"peak_{d}"] = peaks[:, j]
            else:
                cols[c] = self.rows[c][lo:hi]
        df = pd.DataFrame(cols, index=pd.RangeIndex(lo, hi))
        return df.astype({"iteration": np.int64, "feasible": bool, "accepted": bool,
                          "cost": np.float64, "time": np.float64, "best_cost": np.float64,
                          "elapsed": np.float64})

    @property
    def frame(self) -> pd.DataFrame:
        """All rows as a DataFrame (new rows appended to the cached frame)."""
        n = len(self)
        done = 0 if self._frame is None else len(self._frame)
        if self._frame is None or done < n:
            new = self._build(done, n)
            self._frame = new if self._frame is None or done == 0 else \
                pd.concat([self._frame, new])
        return self._frame

    def acceptance_rate(self, window: int | None = 100) -> float:
        """Share of the last ``window`` proposals accepted (all when ``None``; NaN if none)."""
        acc = self.rows["accepted"]
        tail = acc if window is None else acc[-int(window):] if window > 0 else []
        return float(np.mean(tail)) if tail else float("nan")

    # ------------------------------------------------------------------ persistence
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready columns."""
        return {**{c: list(v) for c, v in self.rows.items()},
                "peaks": [p.tolist() for p in self.peaks], "devices": self.devices}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> "History":
        """Inverse of :meth:`to_dict`."""
        try:
            h = cls(doc["devices"])
            lengths = {len(doc[c]) for c in _SCALARS} | {len(doc["peaks"])}
            if len(lengths) != 1:
                raise FileFormatError(f"search history columns have different lengths "
                                      f"{sorted(lengths)}; the file is corrupt")
            for c in _SCALARS:
                h.rows[c] = list(doc[c])
            h.rows["best_cost"] = [float("inf") if v is None else v for v in h.rows["best_cost"]]
            h.peaks = [np.asarray(p, np.float64) for p in doc["peaks"]]
        except KeyError as exc:
            raise FileFormatError(f"search history lacks the column {exc}") from None
        return h
