"""Reductions over the rows of CSR arrays (``ptr``, ``values``), with a value for empty rows.

The memory plan keeps per record the units that save, read or use a storage as CSR rows; its
rules are minima, maxima and counts over those rows, computed here for all rows at once.
"""
from __future__ import annotations

import numpy as np

__all__ = ["row_of", "row_min", "row_max", "row_count", "take_rows"]


def row_of(ptr: np.ndarray) -> np.ndarray:
    """The row of every element.

    >>> row_of(np.array([0, 2, 2, 3])).tolist()
    [0, 0, 2]
    """
    return np.repeat(np.arange(len(ptr) - 1), np.diff(ptr))


def _reduce(ufunc, ptr: np.ndarray, values: np.ndarray, empty) -> np.ndarray:
    full = np.diff(ptr) > 0
    out = np.full(len(ptr) - 1, empty, dtype=np.result_type(values, np.asarray(empty)))
    if full.any():
        out[full] = ufunc.reduceat(values, ptr[:-1][full])
    return out


def row_min(ptr: np.ndarray, values: np.ndarray, empty) -> np.ndarray:
    """Smallest value of each row (``empty`` for empty rows).

    >>> row_min(np.array([0, 2, 2, 3]), np.array([5, 4, 7]), -1).tolist()
    [4, -1, 7]
    """
    return _reduce(np.minimum, ptr, values, empty)


def row_max(ptr: np.ndarray, values: np.ndarray, empty) -> np.ndarray:
    """Largest value of each row (``empty`` for empty rows).

    >>> row_max(np.array([0, 2, 2, 3]), np.array([5, 4, 7]), -1).tolist()
    [5, -1, 7]
    """
    return _reduce(np.maximum, ptr, values, empty)


def row_count(ptr: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Number of true elements of each row.

    >>> row_count(np.array([0, 2, 2, 3]), np.array([True, True, False])).tolist()
    [2, 0, 0]
    """
    return np.bincount(row_of(ptr)[mask], minlength=len(ptr) - 1)


def take_rows(ptr: np.ndarray, values: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The CSR arrays of the selected ``rows`` (in the order given).

    >>> p, v = take_rows(np.array([0, 2, 2, 3]), np.array([5, 4, 7]), np.array([2, 0]))
    >>> p.tolist(), v.tolist()
    ([0, 1, 3], [7, 5, 4])
    """
    lens = ptr[rows + 1] - ptr[rows]
    out_ptr = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(lens, out=out_ptr[1:])
    # element k of the output comes from ptr[row] + (k - out_ptr[row's position])
    src = np.repeat(ptr[rows] - out_ptr[:-1], lens) + np.arange(out_ptr[-1])
    return out_ptr, values[src]
