"""Reductions over the rows of CSR arrays (``ptr``, ``values``), with a value for empty rows.

The memory model keeps per record the units that save, read or use a storage as CSR rows; its
rules need each element's row and each row's maximum, computed here for all rows at once.
"""
from __future__ import annotations

import numpy as np

__all__ = ["row_of", "row_max"]


def row_of(ptr: np.ndarray) -> np.ndarray:
    """The row of every element.

    >>> row_of(np.array([0, 2, 2, 3])).tolist()
    [0, 0, 2]
    """
    return np.repeat(np.arange(len(ptr) - 1), np.diff(ptr))


def row_max(ptr: np.ndarray, values: np.ndarray, empty) -> np.ndarray:
    """Largest value of each row (``empty`` for empty rows).

    >>> row_max(np.array([0, 2, 2, 3]), np.array([5, 4, 7]), -1).tolist()
    [5, -1, 7]
    """
    full = np.diff(ptr) > 0
    out = np.full(len(ptr) - 1, empty, dtype=np.result_type(values, np.asarray(empty)))
    if full.any():
        out[full] = np.maximum.reduceat(values, ptr[:-1][full])
    return out
