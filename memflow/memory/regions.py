"""Blocks as tensor-parallel regions: which tensors a split block keeps to itself.

Megatron splits a transformer layer as a whole: its parameter-free parts (attention glue,
softmax, dropouts, GELU, residual adds) run on every tensor rank on their part of the heads or
features, like its Linears. At the ``"blocks"`` granularity the layer is one unit and what it
keeps to itself is what no other unit reads. At a finer one (leaves, to recompute the attention
core alone) the capture's ``block`` column (:func:`memflow.graph.units.enclosing_blocks`) says
which units form the layer; a tensor read only inside its producer's block is the block's own,
split with it as a tensor internal to a split unit is (:func:`memflow.memory.records.placements`),
and only what crosses the block's edge is communicated (:mod:`memflow.sim.structure`) — where
the block runs whole on one placement (:func:`whole_blocks`,
``Strategy.tensor_parallel(..., whole_blocks=True)``). Split units of a block on mixed
placements (its Linears split, its activations not: FlexFlow's per-unit splits, each output
gathered) and a graph without the column (each unit its own block) keep the unit rule.
"""
from __future__ import annotations

import numpy as np

__all__ = ["unit_blocks", "internal_tensors", "whole_blocks", "block_edge_bytes"]


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


def whole_blocks(block: np.ndarray, layout: np.ndarray, split: np.ndarray | None = None
                 ) -> np.ndarray:
    """Per unit, whether every unit of its block (``block``: :func:`unit_blocks`) runs on its
    placement (``layout``: placement per unit) and, given ``split`` (per unit: a parameter
    split), is split as it is (a unit replicated on a tensor-parallel group shares the group's
    placement, not its split: :mod:`memflow.sim.replication`).

    >>> whole_blocks(np.array([0, 1, 1, 3, 3]), np.array([0, 1, 1, 1, 0])).tolist()
    [True, True, True, False, False]
    >>> whole_blocks(np.array([0, 0]), np.array([1, 1]), np.array([True, False])).tolist()
    [False, False]
    """
    key = layout if split is None else 2 * layout + split
    lo = np.full(len(block), np.iinfo(np.int64).max)
    hi = np.full(len(block), -1)
    np.minimum.at(lo, block, key)
    np.maximum.at(hi, block, key)
    return lo[block] == hi[block]


def block_edge_bytes(ga, layout: np.ndarray, split: np.ndarray, out_bytes: np.ndarray,
                     in_grad: np.ndarray, microbatches: int) -> tuple[np.ndarray, np.ndarray]:
    """Per unit, the bytes of its outputs and of its input gradients in one micro-batch that
    cross its block's edge — what a split unit all-reduces (``out_bytes``, ``in_grad``: every
    output read by another unit and every input gradient, returned as they are when each unit
    is its own block, or no unit is ``split``). A tensor read only inside its producer's
    block, when the block runs whole on one placement (``layout``: placement per unit), does
    not cross it; one read by several units of such a block sends its gradient back once.

    >>> import types
    >>> ga = types.SimpleNamespace(
    ...     n=2, block=np.array([0, 0]), bytes=np.array([8., 4.]), per_sample=np.zeros(2, bool),
    ...     producer=np.array([0, 1]), is_output=np.array([0, 1], bool),
    ...     readers_ptr=np.array([0, 1, 1]), readers_idx=np.array([1]),
    ...     internal=np.array([True, False]), requires_grad=np.ones(2, bool))
    >>> split = np.array([True, True])
    >>> [x.tolist() for x in block_edge_bytes(ga, np.array([0, 0]), split, None, None, 1)]
    [[0.0, 4.0], [0.0, 0.0]]
    """
    if not split.any() or (ga.block == np.arange(ga.n)).all():
        return out_bytes, in_grad
    size = ga.bytes / np.where(ga.per_sample, microbatches, 1)
    rows = np.repeat(np.arange(len(ga.bytes)), np.diff(ga.readers_ptr))
    whole = whole_blocks(ga.block, layout, split)
    crosses = ~(ga.internal & whole[np.maximum(ga.producer, 0)])
    out = np.flatnonzero((ga.producer >= 0) & ((np.diff(ga.readers_ptr) > 0) | ga.is_output)
                         & crosses)
    out_bytes = np.zeros(ga.n)
    np.add.at(out_bytes, ga.producer[out], size[out])
    # a whole block receives a gradient once per tensor (as one unit does), at its first
    # reader: the last backward of the block that reads it
    reader = np.where(whole[ga.readers_idx], ga.block[ga.readers_idx], ga.readers_idx)
    _, first = np.unique(rows * ga.n + reader, return_index=True)
    grad = np.zeros(len(rows), bool)
    grad[first] = True
    grad &= ga.requires_grad[rows] & crosses[rows]
    in_grad = np.zeros(ga.n)
    np.add.at(in_grad, ga.readers_idx[grad], size[rows[grad]])
    # read-only as the per-graph arrays returned above: a compiled reader is compiled once
    # for both (numba specialises on writeability), not again inside a search
    out_bytes.flags.writeable = in_grad.flags.writeable = False
    return out_bytes, in_grad
