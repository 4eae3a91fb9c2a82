"""Recompute segments as the memory model sees them: where each starts, and which hold.

A segment is a run of consecutive recomputed units (``Strategy.segment``: its number per unit,
-1 outside segments). The memory model names a segment by its first unit, and drops segments
that would hold nothing, exactly as ``torch.utils.checkpoint`` behaves.
"""
from __future__ import annotations

import numpy as np

__all__ = ["segment_starts", "holding_segments"]


def segment_starts(segment: np.ndarray) -> np.ndarray:
    """First unit of each unit's recompute segment (-1 outside segments). Segments are runs,
    so the first unit names a segment whatever the numbering of the others.

    >>> segment_starts(np.array([-1, 0, 0, -1, 1])).tolist()
    [-1, 1, 1, -1, 4]
    """
    seg = np.asarray(segment)
    first = np.ones(len(seg), bool)
    first[1:] = seg[1:] != seg[:-1]
    start = np.maximum.accumulate(np.where(first, np.arange(len(seg)), 0))
    return np.where(seg >= 0, start, -1)


def holding_segments(segment: np.ndarray, saves: np.ndarray) -> np.ndarray:
    """``segment`` without the segments none of whose units saves anything (-1 there).

    Such a segment is not a checkpoint at all: ``torch.utils.checkpoint`` (non-reentrant)
    holds its inputs only through what its ops save, and recomputes only when a saved tensor
    is unpacked, so it holds nothing and never re-runs — as if its units were kept.
    ``saves``: per unit, whether it saves a storage for backward.

    >>> holding_segments(np.array([0, 0, -1, 1, 1]), np.array([0, 1, 0, 0, 0], bool)).tolist()
    [0, 0, -1, -1, -1]
    """
    seg = np.asarray(segment)
    start = segment_starts(seg)
    inside = seg >= 0
    holds = np.zeros(len(seg), bool)
    holds[start[inside & saves]] = True
    return np.where(inside & holds[np.maximum(start, 0)], seg, -1)
