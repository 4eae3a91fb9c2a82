"""Program order of a checkpointed chain on one stream: where each allocation and free falls.

On one stream time never decreases along program order, so the simulator's ledger sees the
memory events of a keep/recompute/offload schedule in program order: the forward passes, then
per unit in reverse its segment's recomputations and its backward, then the optimizer step.
The memory model (:func:`memflow.memory.blocks.step_blocks`) names each event by an *anchor*
(kind, unit, edge: 0 start, 1 end); :func:`position` turns an anchor into an integer position,
four per task: start ``4k``, a transfer event during it ``4k+1``, end ``4k+2``, a transfer
start after it ``4k+3``. The transfers follow the simulator's vDNN rule: an offload ends before
the next forward starts, a prefetch lands during the next unit's backward (the last unit's
right after its offload, before the first backward). The functions are compiled
(:mod:`memflow.memory.jit`): the DP's block transitions call them in their inner loop.

>>> from memflow.memory.blocks import A_BWD, A_FWD
>>> [position(A_FWD, 0, 0, 3, 0), position(A_FWD, 2, 1, 3, 2), position(A_BWD, 2, 0, 3, 2)]
[0, 10, 24]
>>> bwd_end(0, 3) > bwd_end(2, 3)                 # backward runs in reverse
True
"""
from __future__ import annotations

import numpy as np

from ...errors import SearchError
from ...memory.blocks import A_BWD, A_FWD, A_OFFLOAD, A_OPT, A_PREFETCH, A_RECOMP
from ...memory.jit import njit

__all__ = ["position", "bwd_end", "check_kinds"]

_KINDS = (A_FWD, A_RECOMP, A_BWD, A_OPT, A_OFFLOAD, A_PREFETCH)


@njit
def _slot(v: int, n: int) -> int:
    """Where unit ``v``'s backward block (its segment's recomputations, then itself) sits."""
    return 4 * n + (4 * n + 4) * (n - 1 - v)


@njit
def position(kind: int, unit: int, edge: int, n: int, seg_end: int) -> int:
    """Position of anchor ``(kind, unit, edge)`` in a chain of ``n`` units; ``seg_end`` is the
    last unit of the segment of ``unit`` clamped to the chain (itself when kept)."""
    u = min(max(unit, 0), n - 1)
    if kind == A_FWD:
        return 4 * u + 2 * edge
    if kind == A_RECOMP:
        return _slot(seg_end, n) + 4 * u + 2 * edge
    if kind == A_BWD:
        return _slot(u, n) + 4 * n + 2 * edge
    if kind == A_OFFLOAD:
        return 4 * u + 3                          # before the next forward starts
    if kind == A_PREFETCH:
        if u == n - 1:
            return _slot(u, n) + 4 * n - 1       # right after its offload, before backward
        return _slot(u + 1, n) + 4 * n + 1        # during the next unit's backward
    return 4 * n + (4 * n + 4) * n + 2 * edge     # the optimizer step


@njit
def bwd_end(u: int, n: int) -> int:
    """Position of the end of unit ``u``'s backward."""
    return _slot(u, n) + 4 * n + 2


def check_kinds(kinds: np.ndarray) -> None:
    """Raise :class:`~memflow.errors.SearchError` if an anchor kind has no place in a chain's
    program order (a transfer between placements, a compression).

    >>> check_kinds(np.array([A_FWD, A_BWD]))
    """
    if not np.isin(kinds, _KINDS).all():
        raise SearchError("optimal_checkpointing met a transfer between placements or a "
                          "compression in the memory plan; it plans one placement's "
                          "keep/recompute/offload only")
