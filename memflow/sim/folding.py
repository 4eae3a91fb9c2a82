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

from ..memory.jit import njit

__all__ = ["classes", "rows_of"]

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
    sig = _signatures(max(len(ptr) - 1, 1)).view(np.uint64)   # same bits: all positive
    cls, out, c_cls = _classes(np.asarray(ptr, np.int64), np.asarray(idx, np.int64),
                               int(n_items), bool(fold), sig)
    return cls, (out, c_cls)


@njit
def _classes(ptr, idx, n_items, fold, sig):
    """:func:`classes` as one compiled pass (it runs twice for every new placement of a
    search): an item's key is the wrapping sum of the signatures of the distinct sets that
    hold it; classes are numbered by their first item. Only the items some set holds are
    sorted by key (most of a cluster's links are in no set of a strategy: their key is 0),
    and a set's few classes are put in order in place."""
    n_sets = len(ptr) - 1
    cls = np.arange(n_items)
    if fold:
        key = np.zeros(n_items, np.uint64)
        mark = np.full(n_items, -1, np.int64)
        held = np.empty(n_items, np.int64)
        n_held = 0
        for k in range(n_sets):
            for j in range(ptr[k], ptr[k + 1]):
                it = idx[j]
                if mark[it] != k:
                    if mark[it] < 0:
                        held[n_held] = it
                        n_held += 1
                    mark[it] = k
                    key[it] += sig[k]
        held = held[:n_held]
        order = held[np.argsort(key[held])]
        # equal keys, one group; the items in no set (key 0) join a held item whose sum
        # wrapped to 0, else make a group of their own
        group = np.full(n_items, -1, np.int64)
        g = 0
        zero = -1
        for r in range(n_held):
            if r > 0 and key[order[r]] != key[order[r - 1]]:
                g += 1
            group[order[r]] = g
            if key[order[r]] == 0:
                zero = g
        if zero < 0:
            zero = g + 1
        number = np.full(n_items + 1, -1, np.int64)
        n_cls = 0
        for it in range(n_items):
            gi = group[it] if mark[it] >= 0 else zero
            if number[gi] < 0:
                number[gi] = n_cls
                n_cls += 1
            cls[it] = number[gi]
    n_cls = cls.max() + 1 if n_items else 0
    out = np.zeros(n_sets + 1, np.int64)
    c_cls = np.empty(len(idx), np.int64)
    seen = np.full(max(n_cls, 1), -1, np.int64)
    m = 0
    for k in range(n_sets):
        start = m
        for j in range(ptr[k], ptr[k + 1]):
            c = cls[idx[j]]
            if seen[c] != k:
                seen[c] = k
                # in order as it comes (a set's classes are few; many, sorted after)
                at = m
                if m - start < 32:
                    while at > start and c_cls[at - 1] > c:
                        c_cls[at] = c_cls[at - 1]
                        at -= 1
                c_cls[at] = c
                m += 1
        if m - start > 32:
            c_cls[start:m] = np.sort(c_cls[start:m])
        out[k + 1] = m
    return cls, out, c_cls[:m]


def rows_of(arrays: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """A list of integer arrays as CSR.

    >>> [a.tolist() for a in rows_of([np.array([3]), np.array([], int), np.array([4, 5])])]
    [[0, 1, 1, 3], [3, 4, 5]]
    """
    ptr = np.zeros(len(arrays) + 1, np.int64)
    np.cumsum(np.fromiter(map(len, arrays), np.int64, len(arrays)), out=ptr[1:])
    idx = (np.concatenate(arrays).astype(np.int64, copy=False) if arrays
           else np.zeros(0, np.int64))
    return ptr, idx
