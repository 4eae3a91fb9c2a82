"""What the placements decide about the tasks of one training step, made once per placement.

A :class:`Structure` holds, as arrays, what the expansion of a step's tasks
(:func:`memflow.sim.expand.expand`) needs and no memory policy changes: the program order
of (stage, forward or backward, micro-batch), each unit's stage, layout, reads and gradient
waits, the copies between placements, the bytes of tensor-parallel all-reduces, the DDP
gradient buckets, and the bytes each sharded unit all-gathers (parameters) and
reduce-scatters (gradients).
"""
from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass

import numpy as np

from ..memory.jit import njit
from ..memory.records import Placed
from ..memory.regions import block_edge_bytes
from .pipeline import program_order

__all__ = ["Structure", "structure", "with_states", "BUCKET_CAP", "FIRST_BUCKET"]

BUCKET_CAP = 25 * 2 ** 20       # DDP's bucket_cap_mb
FIRST_BUCKET = 2 ** 20          # DDP's first bucket is small so communication starts early


@dataclass
class Structure:
    """What expansion needs from the placements: per unit, per copy, per bucket arrays."""

    n_layouts: int
    op_stage: np.ndarray       # program order of (stage, backward?, micro-batch)
    op_back: np.ndarray
    op_mb: np.ndarray
    stage_units: tuple[np.ndarray, np.ndarray]    # CSR per stage, units ascending
    final_mb: np.ndarray       # per stage: micro-batch of its last backward
    reads: tuple[np.ndarray, np.ndarray]          # CSR per unit, anchors (kind, key)
    grads_in: tuple[np.ndarray, np.ndarray]
    copies_from: tuple[np.ndarray, np.ndarray]    # CSR per unit: copies after its forward
    copies_back: tuple[np.ndarray, np.ndarray]    # CSR per unit: gradient copies after backward
    copy_src: np.ndarray       # the copy waits for its producer's forward
    copy_bytes: np.ndarray
    layout: np.ndarray         # per unit
    tp_out: np.ndarray         # per unit: bytes of the tensor-parallel all-reduce in forward
    tp_in: np.ndarray          # ... and of the input gradient in backward
    buckets: tuple[np.ndarray, np.ndarray]        # CSR per stage: bucket ids
    bucket_layout: np.ndarray
    bucket_bytes: np.ndarray
    bucket_units: tuple[np.ndarray, np.ndarray]   # CSR per bucket
    gather: np.ndarray         # per unit: full parameter bytes all-gathered before its
                               # forward, backward and recomputation (parameter sharding)
    scatter: np.ndarray        # per unit: full gradient bytes reduce-scattered after its backward


@njit
def _bucketize(stage_ptr, stage_units, layout, degrees, part_bytes, first_cap, cap):
    """DDP buckets per stage: per replicated layout (its sample times attribute degree of
    ``degrees`` over 1; ascending) its units in backward order, ~1 MiB first, then ~25 MiB
    each. Returns (bucket ptr per stage, bucket ids, layout, bytes, unit ptr, units)."""
    n_st, n_lay = len(stage_ptr) - 1, len(degrees)
    s_ptr = np.zeros(n_st + 1, np.int64)
    b_lay = np.empty(len(stage_units), np.int64)
    b_bytes = np.empty(len(stage_units))
    b_ptr = np.zeros(len(stage_units) + 1, np.int64)
    units = np.empty(len(stage_units), np.int64)
    nb = 0
    nu = 0
    for s in range(n_st):
        mine = stage_units[stage_ptr[s]:stage_ptr[s + 1]]
        # the stage's units by layout (ascending within each), where scanning the stage
        # once per layout was quadratic in a search's many layouts
        l_ptr, by_layout = _by_key(layout[mine], n_lay, mine)
        for lay in range(n_lay):
            if l_ptr[lay] == l_ptr[lay + 1] or degrees[lay, 0] * degrees[lay, 2] <= 1:
                continue
            size = 0.0
            first = True
            count = 0
            for j in range(l_ptr[lay + 1] - 1, l_ptr[lay] - 1, -1):
                u = by_layout[j]
                if part_bytes[u] <= 0:
                    continue
                units[nu] = u
                nu += 1
                count += 1
                size += part_bytes[u]
                if size >= (first_cap if first else cap):
                    b_lay[nb], b_bytes[nb] = lay, 0.0
                    nb += 1
                    b_ptr[nb] = nu
                    first = False
                    size = 0.0
                    count = 0
            if count:
                b_lay[nb] = lay
                nb += 1
                b_ptr[nb] = nu
        s_ptr[s + 1] = nb
    for b in range(nb):   # summed again in bucket order, as DDP's flat buffer is
        total = 0.0
        for k in range(b_ptr[b], b_ptr[b + 1]):
            total += part_bytes[units[k]]
        b_bytes[b] = total
    return s_ptr, np.arange(nb), b_lay[:nb], b_bytes[:nb], b_ptr[:nb + 1], units[:nu]


@functools.lru_cache(maxsize=64)
def _program(stages: int, microbatches: int, schedule: str) -> tuple[np.ndarray, ...]:
    """The program order as arrays (stage, backward?, micro-batch) and each stage's last
    backward micro-batch; a search re-places with the same few (stages, micro-batches)."""
    order = program_order(stages, microbatches, schedule)
    op_stage = np.array([s for s, _, _ in order], np.int64)
    op_back = np.array([op == "B" for _, op, _ in order], bool)
    op_mb = np.array([m for _, _, m in order], np.int64)
    last_op = np.full(stages, -1)
    np.maximum.at(last_op, op_stage[op_back], np.flatnonzero(op_back))
    out = (op_stage, op_back, op_mb, op_mb[last_op])
    for x in out:
        x.flags.writeable = False
    return out


_UNIT_BYTES: dict[tuple[int, int], tuple] = {}


def _unit_bytes(ga, microbatches: int) -> tuple[np.ndarray, np.ndarray]:
    """Per unit, the bytes of its outputs and of the gradients of its inputs in one
    micro-batch (kept per graph arrays and micro-batches: no placement changes them)."""
    hit = _UNIT_BYTES.get((id(ga), microbatches))
    if hit is not None and hit[0]() is ga:
        return hit[1]
    n = ga.n
    size = ga.bytes / np.where(ga.per_sample, microbatches, 1)
    has_readers = np.diff(ga.readers_ptr) > 0
    out = np.flatnonzero((ga.producer >= 0) & (has_readers | ga.is_output))
    out_bytes = np.zeros(n)
    np.add.at(out_bytes, ga.producer[out], size[out])
    r_t = np.repeat(np.arange(len(ga.bytes)), np.diff(ga.readers_ptr))
    grad = ga.requires_grad[r_t]
    in_grad = np.zeros(n)
    np.add.at(in_grad, ga.readers_idx[grad], size[r_t[grad]])
    out_bytes.flags.writeable = in_grad.flags.writeable = False
    if len(_UNIT_BYTES) > 64:        # graphs long gone
        _UNIT_BYTES.clear()
    _UNIT_BYTES[(id(ga), microbatches)] = (weakref.ref(ga), (out_bytes, in_grad))
    return out_bytes, in_grad


def structure(ga, placed: Placed, layout: np.ndarray, degrees: np.ndarray, stage: np.ndarray,
              microbatches: int, schedule: str, states=None,
              parameter: np.ndarray | None = None) -> Structure:
    """The placement-only part of the expansion of one strategy; ``states`` (its units'
    :class:`~memflow.memory.states.UnitStates`, default: unsharded, the graph's widths)
    decides what the DDP buckets reduce and what sharded units gather and scatter;
    ``parameter`` (per unit, default its placement's) the units whose parameter split
    all-reduces (a unit replicated on its group's placement exchanges nothing:
    :mod:`memflow.sim.replication`)."""
    M = int(microbatches)
    # bytes of each unit's outputs and of the gradients of its inputs (tensor parallelism)
    p = degrees[layout, 1] if parameter is None else parameter
    out_bytes, in_grad = block_edge_bytes(ga, layout, p > 1, *_unit_bytes(ga, M), M)
    cp = placed.copies
    st_ptr, st_units, copies_from, copies_back, copy_src, tp_out, tp_in = _placed_fields(
        stage, ga.producer, cp.tensor, cp.first_reader, cp.grad, p, layout, degrees,
        out_bytes, in_grad)
    op_stage, op_back, op_mb, final_mb = _program(len(st_ptr) - 1, M, schedule)
    return Structure(
        n_layouts=len(degrees), op_stage=op_stage, op_back=op_back, op_mb=op_mb,
        stage_units=(st_ptr, st_units), final_mb=final_mb, reads=placed.reads,
        grads_in=placed.grads_in, copies_from=copies_from, copies_back=copies_back,
        copy_src=copy_src, copy_bytes=cp.bytes, layout=layout, tp_out=tp_out, tp_in=tp_in,
        **_state_fields(ga, layout, degrees, st_ptr, st_units, states))


@njit
def _by_key(key, n_keys, items):
    """``items`` grouped by ``key`` (CSR over ``n_keys`` rows, each row in the items' order:
    a stable argsort)."""
    ptr = np.zeros(n_keys + 1, np.int64)
    for j in range(len(key)):
        ptr[key[j] + 1] += 1
    for k in range(n_keys):
        ptr[k + 1] += ptr[k]
    idx = np.empty(len(key), np.int64)
    fill = ptr[:-1].copy()
    for j in range(len(key)):
        idx[fill[key[j]]] = items[j]
        fill[key[j]] += 1
    return ptr, idx


@njit
def _placed_fields(stage, producer, c_tensor, c_first, c_grad, p, layout, degrees, out_bytes,
                   in_grad):
    """The fields of a :class:`Structure` its records decide, as one compiled pass (~20
    numpy calls per new placement of a search): the units per stage (a unit of stage -1 in
    stage 0; as many stages as the last), the copies after each unit's forward (from its
    producer, else its first reader) and the gradient copies after each unit's backward
    (CSR), whether each copy waits for its producer, and the bytes of each split unit's
    tensor-parallel all-reduces in forward and backward."""
    n, C = len(stage), len(c_tensor)
    stage = np.maximum(stage, 0)
    stages = stage.max() + 1
    src = np.empty(C, np.int64)
    copy_src = np.empty(C, np.bool_)
    n_back = 0
    for c in range(C):
        copy_src[c] = producer[c_tensor[c]] >= 0
        src[c] = producer[c_tensor[c]] if copy_src[c] else c_first[c]
        n_back += c_grad[c]
    back = np.empty(n_back, np.int64)
    back_first = np.empty(n_back, np.int64)
    j = 0
    for c in range(C):
        if c_grad[c]:
            back[j], back_first[j] = c, c_first[c]
            j += 1
    tp_out = np.zeros(n)
    tp_in = np.zeros(n)
    for u in range(n):
        if p[u] > 1:    # over its replicas: sample times attribute degree
            sa = degrees[layout[u], 0] * degrees[layout[u], 2]
            tp_out[u], tp_in[u] = out_bytes[u] / sa, in_grad[u] / sa
    st_ptr, st_units = _by_key(stage, stages, np.arange(n))
    return (st_ptr, st_units, _by_key(src, n, np.arange(C)), _by_key(back_first, n, back),
            copy_src, tp_out, tp_in)


def _state_fields(ga, layout: np.ndarray, degrees: np.ndarray, st_ptr: np.ndarray,
                  st_units: np.ndarray, states) -> dict:
    """The fields of a :class:`Structure` the units' model states decide: the DDP buckets
    and the bytes sharded units gather and scatter."""
    bucketed = ga.trainable_bytes / degrees[layout, 1] if states is None else states.bucket
    s_ptr, ids, b_lay, b_bytes, b_ptr, b_units = _bucketize(
        st_ptr, st_units, layout, degrees, bucketed, float(FIRST_BUCKET), float(BUCKET_CAP))
    if states is None:          # nothing sharded
        gather = scatter = np.zeros(ga.n)
    else:
        gather, scatter = states.gather, states.scatter
    return dict(buckets=(s_ptr, ids), bucket_layout=b_lay, bucket_bytes=b_bytes,
                bucket_units=(b_ptr, b_units), gather=gather, scatter=scatter)


def with_states(S: Structure, ga, degrees: np.ndarray, states) -> Structure:
    """``S`` (same graph arrays, records, layouts, stages, micro-batches and schedule) with
    other model states: only the buckets and the gathered and scattered bytes re-made (a
    search's shard and optimizer-place moves; :func:`structure` would give the same)."""
    out = object.__new__(Structure)   # copy.copy went through __reduce_ex__: a fifth of this
    vars(out).update(vars(S), **_state_fields(ga, S.layout, degrees, *S.stage_units, states))
    return out
