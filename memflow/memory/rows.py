"""The rows of CSR arrays (``ptr``, ``values``).

The memory model keeps per record the units that save, read or use a storage as CSR rows; its
rules need each element's row, computed here for all rows at once.
"""
from __future__ import annotations

import numpy as np

__all__ = ["row_of"]


def row_of(ptr: np.ndarray) -> np.ndarray:
    """The row of every element.

    >>> row_of(np.array([0, 2, 2, 3])).tolist()
    [0, 0, 2]
    """
    return np.repeat(np.arange(len(ptr) - 1), np.diff(ptr))
