"""Blocks as tensor-parallel regions: which tensors a split block keeps to itself.

Megatron splits a transformer layer as a whole: its parameter-free parts (attention glue,
softmax, dropouts, GELU, residual adds) run on every tensor rank on their part of the heads or
features, like its Linears. At the ``"blocks"`` granularity the layer is one unit and what it
keeps to itself is what no other unit reads. At a finer one (leaves, to recompute the attention
core alone) the capture's ``block`` column (:func:`memflow.graph.units.enclosing_blocks`) says
which units form the layer; a tensor read only inside its producer's block is the block's own,
split with it as a tensor internal to a split unit is (:func:`memflow.memory.records.placements`),
and only what crosses the block's edge is communicated (:mod:`memflow.sim.structure`). A graph
without the column (each unit its own block) keeps the unit rule.
"""
from __future__ import annotations

import numpy as np

__all__ = ["unit_blocks", "internal_tensors"]


def unit_blocks(blocks) -> np.ndarray:
    """Per unit, the position of the first unit of its block (``blocks``: the units' ``block``
    column, ``""`` outside every block), its own position outside blocks.

    >>> unit_blocks(["", "h.0", "h.0", "h.1", ""]).tolist()
    [0, 1, 1, 3, 4]
    """
    first: dict[str, int] = {}
    return np.array([first.setdefault(b, i) if b else i for i, b in enumerate(blocks)],
                    np.int64)


def internal_tensors(producer: np.ndarray, readers_ptr: np.ndarray, readers_idx: np.ndarray,
                     is_output: np.ndarray, block: np.ndarray) -> np.ndarray:
    """Per tensor: made by a unit, not a model output, and read (in forward) only by units of
    its producer's block — with one unit per block, read by no other unit.

    >>> internal_tensors(np.array([-1, 0, 1, 1]), np.array([0, 1, 2, 3, 3]),
    ...                  np.array([0, 1, 2]), np.zeros(4, bool), np.array([0, 1, 1])).tolist()
    [False, False, True, True]
    """
    rows = np.repeat(np.arange(len(producer)), np.diff(readers_ptr))
    mine = block[np.maximum(producer, 0)]
    outside = np.zeros(len(producer), bool)
    outside[rows[block[readers_idx] != mine[rows]]] = True
    return (producer >= 0) & ~is_output & ~outside
