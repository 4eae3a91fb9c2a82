"""Replica folding: channels and devices that always work together are simulated once.

Every task occupies all parts of its placement at once, so two channels used by exactly the
same tasks always have the same free time, and two devices holding parts of exactly the same
placements have the same memory ledger. Identical data-parallel replicas (and the ranks of a
tensor-parallel group) are such channels and devices: folding keeps one representative of
each class, which makes a 1,024-GPU data-parallel step cost what one replica costs. The
result is the same as without folding by construction; ``fold=False`` keeps every channel
and device separate, and the tests check the two agree.

Sets come as CSR rows (``ptr``, ``idx``) and are grouped all at once: a search re-places a
strategy for every configuration move, and a copy between placements is a set of its own.
"""
from __future__ import annotations

import numpy as np

__all__ = ["classes", "stack_rows", "rows_of"]

# a random 64-bit signature per set, drawn once (an item's class key is the sum over its sets)
_SIG = np.random.default_rng(12345).integers(1, 2 ** 62, size=1 << 12, dtype=np.int64)


def _signatures(k: int) -> np.ndarray:
    global _SIG
    if k > len(_SIG):      # the same stream, longer: the first signatures never change
        _SIG = np.random.default_rng(12345).integers(1, 2 ** 62, size=2 * k, dtype=np.int64)
    return _SIG[:k]


def classes(ptr: np.ndarray, idx: np.ndarray, n_items: int,
            fold: bool = True) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """Group items by the sets that contain them.

    Set ``k`` holds the items ``idx[ptr[k]:ptr[k + 1]]`` (channels, devices). Returns the class
    of each item and, per set, the distinct classes it covers (CSR, ascending). Without
    ``fold`` each item is its own class.

    >>> cls, (p, c) = classes(np.array([0, 3, 5]), np.array([0, 1, 2, 2, 3]), 5)
    >>> cls.tolist(), p.tolist(), c.tolist()
    ([0, 0, 1, 2, 3], [0, 2, 4], [0, 1, 1, 2])
    """
    n_sets = len(ptr) - 1
    rows = np.repeat(np.arange(n_sets, dtype=np.int64), np.diff(ptr))
    items = np.asarray(idx, np.int64)
    if fold:
        pairs = np.unique(rows * n_items + items)          # each item once per set
        p_set, p_item = np.divmod(pairs, n_items)
        key = np.zeros(n_items, np.uint64)
        np.add.at(key, p_item, _signatures(max(n_sets, 1))[p_set].astype(np.uint64))
        _, first, inv = np.unique(key, return_index=True, return_inverse=True)
        cls = np.argsort(np.argsort(first))[inv].astype(np.int64)   # numbered by first item
    else:
        cls = np.arange(n_items, dtype=np.int64)
    n_cls = int(cls.max(initial=-1)) + 1
    codes = np.unique(rows * max(n_cls, 1) + cls[items])
    c_set, c_cls = np.divmod(codes, max(n_cls, 1))
    out = np.zeros(n_sets + 1, np.int64)
    np.cumsum(np.bincount(c_set, minlength=n_sets), out=out[1:])
    return cls, (out, c_cls)


def stack_rows(*blocks: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """CSR blocks ``(ptr, idx)`` one after the other, as one CSR.

    >>> [a.tolist() for a in stack_rows((np.array([0, 2]), np.array([1, 2])),
    ...                                 (np.array([0, 0, 1]), np.array([7])))]
    [[0, 2, 2, 3], [1, 2, 7]]
    """
    lens = np.concatenate([np.diff(p) for p, _ in blocks])
    ptr = np.zeros(len(lens) + 1, np.int64)
    np.cumsum(lens, out=ptr[1:])
    return ptr, np.concatenate([np.asarray(i, np.int64) for _, i in blocks])


def rows_of(arrays: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """A list of integer arrays as CSR.

    >>> [a.tolist() for a in rows_of([np.array([3]), np.array([], int), np.array([4, 5])])]
    [[0, 1, 1, 3], [3, 4, 5]]
    """
    ptr = np.zeros(len(arrays) + 1, np.int64)
    np.cumsum([len(a) for a in arrays], out=ptr[1:])
    idx = np.concatenate(arrays).astype(np.int64) if arrays else np.zeros(0, np.int64)
    return ptr, idx
