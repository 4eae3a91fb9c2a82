"""Replica folding: channels and devices that always work together are simulated once.

Every task occupies all parts of its placement at once, so two channels used by exactly the
same tasks always have the same free time, and two devices holding parts of exactly the same
placements have the same memory ledger. Identical data-parallel replicas (and the ranks of a
tensor-parallel group) are such channels and devices: folding keeps one representative of
each class, which makes a 1,024-GPU data-parallel step cost what one replica costs. The
result is the same as without folding by construction; ``fold=False`` keeps every channel
and device separate, and the tests check the two agree.
"""
from __future__ import annotations

import numpy as np

__all__ = ["classes"]


def classes(members: list[np.ndarray], n_items: int, fold: bool = True) -> tuple[np.ndarray, list[np.ndarray]]:
    """Group items by the sets that contain them.

    ``members[k]`` lists the items (channels, devices) of set ``k``. Returns the class of each
    item and, per set, the distinct classes it covers. Without ``fold`` each item is its own
    class.

    >>> cls, per_set = classes([np.array([0, 1, 2]), np.array([2, 3])], 5)
    >>> cls.tolist(), [s.tolist() for s in per_set]
    ([0, 0, 1, 2, 3], [[0, 1], [1, 2]])
    """
    if not fold:
        ident = np.arange(n_items)
        return ident, [np.unique(m) for m in members]
    # a random 64-bit signature per set; an item's class key is the sum over its sets
    rng = np.random.default_rng(12345)
    sig = rng.integers(1, 2 ** 62, size=max(len(members), 1), dtype=np.int64)
    key = np.zeros(n_items, np.uint64)
    for k, m in enumerate(members):
        key[np.unique(m)] += np.uint64(sig[k])
    _, first, inv = np.unique(key, return_index=True, return_inverse=True)
    cls = np.argsort(np.argsort(first))[inv].astype(np.int64)   # numbered by first item
    return cls, [np.unique(cls[m]) for m in members]
