"""Program order of a checkpointed chain on one stream: where each allocation and free falls.

On one stream time never decreases along program order, so the simulator's ledger sees the
memory events of a keep/recompute/offload schedule in program order: the forward passes, then
per unit in reverse its segment's recomputations and its backward, then the optimizer step.
The memory model (:func:`memflow.memory.blocks.step_blocks`) names each event by an *anchor*
(kind, unit, edge: 0 start, 1 end); :class:`Order` turns anchors into integer positions, four
per task: start ``4k``, a transfer event during it ``4k+1``, end ``4k+2``, a transfer start
after it ``4k+3``. The transfers follow the simulator's vDNN rule: an offload ends before the
next forward starts, a prefetch lands during the next unit's backward (the last unit's right
after its offload, before the first backward).

>>> import numpy as np
>>> from memflow.memory.blocks import A_BWD, A_FWD
>>> order = Order(3, np.arange(3))                 # three units, none recomputed
>>> order.pos(np.array([[A_FWD, 0, 0], [A_FWD, 2, 1], [A_BWD, 2, 0]])).tolist()
[0, 10, 24]
>>> order.bwd_end(0) > order.bwd_end(2)           # backward runs in reverse
True
"""
from __future__ import annotations

import numpy as np

from ...errors import SearchError
from ...memory.blocks import A_BWD, A_FWD, A_OFFLOAD, A_OPT, A_PREFETCH, A_RECOMP

__all__ = ["Order"]


class Order:
    """Program order of a schedule of ``n`` units: ``pos`` gives the position of anchors,
    ``seg_end`` each recomputed unit's segment end (the unit itself when kept)."""

    def __init__(self, n: int, seg_end: np.ndarray):
        self.n, self.seg_end = n, seg_end

    def _slot(self, v: np.ndarray) -> np.ndarray:
        """Where unit ``v``'s backward block (its segment's recomputations, then itself) sits."""
        n = self.n
        return 4 * n + (4 * n + 4) * (n - 1 - v)

    def pos(self, anchor: np.ndarray) -> np.ndarray:
        n = self.n
        kind, unit, edge = anchor[..., 0], anchor[..., 1], anchor[..., 2]
        known = (kind == A_FWD) | (kind == A_RECOMP) | (kind == A_BWD) | (kind == A_OPT) | (
            kind == A_OFFLOAD) | (kind == A_PREFETCH)
        if not known.all():
            raise SearchError("optimal_checkpointing met a transfer between placements or a "
                              "compression in the memory plan; it plans one placement's "
                              "keep/recompute/offload only")
        u = np.minimum(np.maximum(unit, 0), n - 1)
        nxt = np.minimum(u + 1, n - 1)
        last = (kind == A_PREFETCH) & (u == n - 1)     # prefetched right after its offload
        return np.select(
            [kind == A_FWD, kind == A_RECOMP, kind == A_BWD, kind == A_OFFLOAD, last,
             kind == A_PREFETCH],
            [4 * u + 2 * edge, self._slot(self.seg_end[u]) + 4 * u + 2 * edge,
             self._slot(u) + 4 * n + 2 * edge,
             4 * u + 3,                                  # before the next forward starts
             self._slot(u) + 4 * n - 1,                  # before the first backward
             self._slot(nxt) + 4 * n + 1],               # during the next unit's backward
            4 * n + (4 * n + 4) * n + 2 * edge)

    def bwd_end(self, u: int) -> int:
        """Position of the end of unit ``u``'s backward."""
        return int(self.pos(np.array([A_BWD, u, 1])))

    def free(self, frees: np.ndarray, alloc: np.ndarray) -> np.ndarray:
        """Where each block (candidate anchors ``(k, 3, 3)``) is freed: its latest anchor,
        never before its allocating task ends (the ledger's rule)."""
        return np.maximum(self.pos(frees).max(1), np.where(alloc % 4 == 0, alloc + 2, alloc))
