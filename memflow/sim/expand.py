"""Expand (graph, strategy, memory plan) into the tasks of one training step, in program order.

A task is one unit's work on all the parts of its placement at once (the parts run in
lockstep, as SPMD data- and tensor-parallel training does), or one transfer, collective,
offload, prefetch, compression or optimizer step. Tasks are listed in *program order*: the
order in which each device's streams issue them. The scheduler keeps that order on every
channel (as a CUDA stream does) and starts a task when its inputs are ready and its channels
are free.

Dependencies are task ids; ``-(j + 1)`` means "after task ``j`` *starts*" (a prefetch is issued
when the backward before it starts, one unit ahead, as vDNN does).

What the placements decide (program order, reads, gradients, copies, DDP buckets) is a
:class:`~memflow.sim.structure.Structure`, made once per placement; :func:`expand` adds what
the policies decide (offloads, prefetches, compressions, recomputations) in one compiled pass
that also looks up each task's duration and channel set. Task kinds and channel roles are the
codes of :mod:`memflow.sim.kinds`.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..memory.blocks import StepBlocks
from ..memory.jit import njit
from ..memory.records import (A_BWD, A_COMPRESS, A_DECOMP, A_FWD, A_GXFER, A_OFFLOAD, A_OPT,
                              A_PREFETCH, A_RECOMP, A_XFER, ANCHOR_KINDS)
from .kinds import (K_ALLRED, K_BWD, K_COMPRESS, K_DECOMP, K_FWD, K_GATHER, K_OFFLOAD, K_OPT,
                    K_PREFETCH, K_RECOMP, K_SCATTER, K_XFER, R_COMM, R_COMPUTE, R_COPY,
                    R_COPYBACK, R_D2H, R_H2D)
from .structure import Structure

__all__ = ["Tasks", "Timing", "expand"]

_NONE = np.iinfo(np.int64).max


@dataclass
class Tasks:
    """Tasks in program order (arrays) and the task of each memory anchor.

    ``kind`` and ``role`` are codes of :mod:`memflow.sim.kinds`. ``table[kind, key,
    microbatch]`` is the task of anchor ``(kind, key)`` (``kind`` one of
    :data:`~memflow.memory.records.ANCHORS`) in a micro-batch (-1: none), :attr:`first` its
    first task in program order. ``channel_set`` indexes the channel sets of the placement
    (compute, comm, to-host, from-host per layout, then copy and copy-back per copy).
    """

    kind: np.ndarray
    unit: np.ndarray
    mb: np.ndarray
    role: np.ndarray
    key: np.ndarray           # layout, or copy id for copies
    work: np.ndarray          # bytes moved (compute: TP all-reduce)
    duration: np.ndarray
    channel_set: np.ndarray
    dep_ptr: np.ndarray
    dep_idx: np.ndarray
    table: np.ndarray

    @cached_property
    def first(self) -> np.ndarray:
        """``first[kind, key]``: the first task of each anchor in program order (-1: none).

        Tasks are numbered in program order and each anchor has one task per micro-batch, so
        its first is the least task of its row of :attr:`table`.
        """
        least = np.where(self.table >= 0, self.table, _NONE).min(axis=2)
        return np.where(least == _NONE, -1, least)

    @property
    def deps(self) -> list[list[int]]:
        """Dependencies of each task as lists (see the module docstring)."""
        return [self.dep_idx[a:b].tolist() for a, b in zip(self.dep_ptr[:-1], self.dep_ptr[1:])]

    def __len__(self) -> int:
        return len(self.kind)


@dataclass
class Timing:
    """Durations the cluster gives: per unit, per bucket, per copy, per layout."""

    forward: np.ndarray        # per unit
    backward: np.ndarray
    allreduce: np.ndarray      # per bucket
    copy: np.ndarray           # per copy
    copy_back: np.ndarray
    d2h: np.ndarray            # per layout: (seconds per byte, latency)
    h2d: np.ndarray
    host_scale: np.ndarray     # per unit: multiplies the seconds per byte of its offload and
                               # prefetch (1: the host link's own rate)
    optimizer: np.ndarray      # per layout
    compress: np.ndarray       # per unit: bytes per second, launches included (1: none)
    decompress: np.ndarray
    gather: np.ndarray         # per unit: its parameters' all-gather (parameter sharding)
    scatter: np.ndarray        # per unit: its gradients' reduce-scatter (gradient sharding)
    # per unit: its recomputation (None: as long as its forward); a selective unit re-runs
    # only its cheap ops, whose forward alone is ``cheap_forward``
    recompute: np.ndarray | None = None
    cheap_forward: np.ndarray | None = None

    @classmethod
    def untimed(cls, S: "Structure", n_units: int) -> "Timing":
        """Every task takes no time (for program-order replays such as ``memflow.estimate``)."""
        def zeros(k: int, *shape: int) -> np.ndarray:
            return np.zeros((k, *shape))

        return cls(forward=zeros(n_units), backward=zeros(n_units),
                   allreduce=zeros(len(S.bucket_layout)), copy=zeros(len(S.copy_src)),
                   copy_back=zeros(len(S.copy_src)), d2h=zeros(S.n_layouts, 2),
                   h2d=zeros(S.n_layouts, 2), host_scale=np.ones(n_units),
                   optimizer=zeros(S.n_layouts), compress=np.ones(n_units),
                   decompress=np.ones(n_units), gather=zeros(n_units), scatter=zeros(n_units))


@njit
def _count(S_ptr, S_units, rd_ptr, gi_ptr, cf_ptr, cb_ptr, seg_start, seg_last, op_stage,
           op_back, n_buckets_units, n_buckets, n_layouts):
    """Upper bounds of the number of tasks and of dependencies that :func:`_expand` emits.

    ``_expand`` writes into arrays of these sizes unchecked, so each of its emissions must be
    counted here, term by term as the comments below say; a change to one is a change to
    both. Offloads, compressions and prefetches are counted whether the policies make them
    or not (an upper bound; ``_expand`` returns the filled part).
    """
    n_st = len(S_ptr) - 1
    f_tasks = np.zeros(n_st, np.int64)     # per stage: in one forward of its units
    f_deps = np.zeros(n_st, np.int64)
    b_tasks = np.zeros(n_st, np.int64)     # ... in one backward
    b_deps = np.zeros(n_st, np.int64)
    for s in range(n_st):
        for k in range(S_ptr[s], S_ptr[s + 1]):
            u = S_units[k]
            reads = rd_ptr[u + 1] - rd_ptr[u]
            copies = cf_ptr[u + 1] - cf_ptr[u]
            back = cb_ptr[u + 1] - cb_ptr[u]
            waits = gi_ptr[u + 1] - gi_ptr[u]
            seg = u - seg_start[u] + 1 if seg_last[u] else 0     # recomputed where it ends
            # tasks: forward, offload, compress (3); a transfer per copy after its forward.
            # deps: forward on its reads and on the previous unit's offload (reads + 1);
            # offload and compress on the forward (2); each transfer on the forward (copies)
            # FSDP: an all-gather before the forward (1 task), on the previous forward's
            # start, and the forward on it (2 deps)
            f_tasks[s] += 3 + copies + 1
            f_deps[s] += reads + 3 + copies + 2
            # tasks: its own prefetch, decompress, backward, the prefetch of the unit before
            # (4); the recomputations of its segment (seg); a gradient transfer per copy back.
            # deps: each recomputation and the backward on its gradients in
            # (waits * (seg + 1)); own prefetch on the offload (1); decompress on the
            # compression (1); backward on forward, prefetch, decompress (3); the next
            # prefetch on its offload and on the backward's start (2); each gradient
            # transfer on the backward (back)
            # FSDP: an all-gather before each recomputation and before the backward, each on
            # the previous compute's start and waited for by its compute (seg + 1 tasks,
            # 2 * (seg + 1) deps); a reduce-scatter on the backward (1 task, 1 dep)
            b_tasks[s] += 4 + seg + back + seg + 2
            b_deps[s] += waits * (seg + 1) + 7 + back + 2 * (seg + 1) + 1
    # once per step: an all-reduce per bucket on the backward of each of its units; an
    # optimizer step per layout on its last four backward or all-reduce tasks (last4)
    tasks = n_buckets + n_layouts
    deps = n_buckets_units + 4 * n_layouts
    for i in range(len(op_stage)):
        if op_back[i]:
            tasks += b_tasks[op_stage[i]]
            deps += b_deps[op_stage[i]]
        else:
            tasks += f_tasks[op_stage[i]]
            deps += f_deps[op_stage[i]]
    return tasks, deps


@njit
def _emit(out, t, d, kind, unit, mb, role, key, work, duration, anchor, row):
    """Task ``t``, whose dependencies end at ``d`` in ``dep_idx``; it runs on the channel
    set of ``role`` and ``key``, and is the task of anchor ``(anchor, row)`` in micro-batch
    ``mb`` (anchor -1: none). Returns the next task's number."""
    kinds, units, mbs, roles, keys, works, durations, sets, dep_ptr, table, set_base = out
    kinds[t], units[t], mbs[t], roles[t], keys[t] = kind, unit, mb, role, key
    works[t], durations[t], sets[t] = work, duration, set_base[role] + key
    if anchor >= 0:
        table[anchor, row, mb] = t
    dep_ptr[t + 1] = d
    return t + 1


@njit
def _gather(out, t, d, dep_idx, u, m, lay, nbytes, duration, after):
    """FSDP's all-gather of unit ``u``'s parameters, issued when compute task ``after``
    starts (prefetch: it overlaps that compute, one unit ahead). Returns ``(t, d)``; the
    caller makes the compute task that needs the parameters depend on task ``t - 1``."""
    if after >= 0:
        dep_idx[d] = -(after + 1)
        d += 1
    return _emit(out, t, d, K_GATHER, u, m, R_COMM, lay, nbytes, duration, -1, 0), d


@njit
def _scatter(out, t, d, dep_idx, last4, u, m, lay, nbytes, duration, after):
    """FSDP's reduce-scatter of unit ``u``'s gradients after its backward, task ``after``
    (issued after the next unit's all-gather, as FSDP's backward prefetch does). Returns
    ``(t, d)``."""
    dep_idx[d] = after
    last4[lay, :3] = last4[lay, 1:].copy()
    last4[lay, 3] = t
    return _emit(out, t, d + 1, K_SCATTER, u, m, R_COMM, lay, nbytes, duration, -1, 0), d + 1


@njit
def _expand(n, M, n_layouts, n_copies, op_stage, op_back, op_mb, S_ptr, S_units, final_mb,
            rd_ptr, rd_kind, rd_key, gi_ptr, gi_kind, gi_key, cf_ptr, cf_copy, cb_ptr,
            cb_copy, copy_src, copy_bytes, layout, tp_out, tp_in, off, comp, seg_start,
            seg_last, bk_ptr, bk_lay, bk_bytes, bu_ptr, bu_units, d_fwd, d_rec, d_bwd, d_ar,
            d_cp, d_cpb, d2h, h2d, host_scale, d_opt, r_comp, r_decomp, gather, scatter,
            d_gather, d_scatter, n_tasks, n_deps):
    """The tasks of one step in program order, in arrays of the sizes :func:`_count` gives.

    In step with ``_count``: every task emitted and every dependency written here is one of
    its terms (the writes are unchecked). A task's dependencies are written to ``dep_idx``
    before :func:`_emit` closes its row; ``table`` gets one task per anchor and micro-batch,
    and tasks are numbered in program order (what :attr:`Tasks.first` relies on).
    """
    dep_ptr = np.zeros(n_tasks + 1, np.int64)
    dep_idx = np.empty(n_deps, np.int64)
    n_keys = max(n, n_copies, n_layouts, 1)
    table = np.full((ANCHOR_KINDS, n_keys, M), -1, np.int64)
    # first channel set of each role (ROLES): compute, comm, to-host, from-host per layout,
    # then copy, copy-back per copy
    set_base = np.array([0, n_layouts, 2 * n_layouts, 3 * n_layouts, 4 * n_layouts,
                         4 * n_layouts + n_copies])
    out = (np.empty(n_tasks, np.int64), np.empty(n_tasks, np.int64), np.empty(n_tasks, np.int64),
           np.empty(n_tasks, np.int64), np.empty(n_tasks, np.int64), np.empty(n_tasks),
           np.empty(n_tasks), np.empty(n_tasks, np.int64), dep_ptr, table, set_base)
    last4 = np.full((n_layouts, 4), -1, np.int64)   # last backward/all-reduce tasks per layout
    wait = np.empty(max(len(gi_kind), 1), np.int64)
    t = 0
    d = 0
    compute_start = -1     # the last compute task emitted: the next all-gather may overlap it
    for i in range(len(op_stage)):
        s, m = op_stage[i], op_mb[i]
        lo, hi = S_ptr[s], S_ptr[s + 1]
        if not op_back[i]:
            offloading = -1
            for k in range(lo, hi):
                u = S_units[k]
                lay = layout[u]
                # Megatron: a split unit all-reduces its output (work: bytes), synchronously;
                # vDNN: a forward waits for the previous unit's offload, which bounds memory
                if gather[u] > 0:
                    t, d = _gather(out, t, d, dep_idx, u, m, lay, gather[u], d_gather[u],
                                   compute_start)
                    dep_idx[d] = t - 1
                    d += 1
                for j in range(rd_ptr[u], rd_ptr[u + 1]):
                    dep_idx[d] = table[rd_kind[j], rd_key[j], m]
                    d += 1
                if offloading >= 0:
                    dep_idx[d] = offloading
                    d += 1
                f = t
                compute_start = f
                t = _emit(out, t, d, K_FWD, u, m, R_COMPUTE, lay, tp_out[u], d_fwd[u], A_FWD, u)
                offloading = -1
                if off[u] > 0:
                    dep_idx[d] = f
                    d += 1
                    offloading = t
                    t = _emit(out, t, d, K_OFFLOAD, u, m, R_D2H, lay, off[u],
                              off[u] * d2h[lay, 0] * host_scale[u] + d2h[lay, 1], A_OFFLOAD, u)
                if comp[u] > 0:
                    dep_idx[d] = f
                    d += 1
                    t = _emit(out, t, d, K_COMPRESS, u, m, R_COMPUTE, lay, comp[u],
                              comp[u] / r_comp[u], A_COMPRESS, u)
                for j in range(cf_ptr[u], cf_ptr[u + 1]):
                    c = cf_copy[j]
                    if copy_src[c]:
                        dep_idx[d] = f
                        d += 1
                    t = _emit(out, t, d, K_XFER, u, m, R_COPY, c, copy_bytes[c], d_cp[c],
                              A_XFER, c)
            continue
        prev_compute = -1
        pending = -1        # the unit whose reduce-scatter waits for the next all-gather
        for k in range(hi - 1, lo - 1, -1):
            u = S_units[k]
            lay = layout[u]
            nw = 0
            for j in range(gi_ptr[u], gi_ptr[u + 1]):
                wait[nw] = table[gi_kind[j], gi_key[j], m]
                nw += 1
            if prev_compute < 0 and off[u] > 0:
                dep_idx[d] = table[A_OFFLOAD, u, m]
                d += 1
                t = _emit(out, t, d, K_PREFETCH, u, m, R_H2D, lay, off[u],
                          off[u] * h2d[lay, 0] * host_scale[u] + h2d[lay, 1], A_PREFETCH, u)
            if seg_last[u]:
                for v in range(seg_start[u], u + 1):
                    if gather[v] > 0:
                        t, d = _gather(out, t, d, dep_idx, v, m, lay, gather[v], d_gather[v],
                                       compute_start)
                        dep_idx[d] = t - 1
                        d += 1
                    for j in range(nw):
                        dep_idx[d] = wait[j]
                        d += 1
                    prev_compute = t
                    compute_start = t
                    t = _emit(out, t, d, K_RECOMP, v, m, R_COMPUTE, lay, tp_out[v], d_rec[v],
                              A_RECOMP, v)
            if comp[u] > 0:
                dep_idx[d] = table[A_COMPRESS, u, m]
                d += 1
                t = _emit(out, t, d, K_DECOMP, u, m, R_COMPUTE, lay, comp[u],
                          comp[u] / r_decomp[u], A_DECOMP, u)
            g = -1
            if gather[u] > 0:
                t, d = _gather(out, t, d, dep_idx, u, m, lay, gather[u], d_gather[u],
                               compute_start)
                g = t - 1
            if pending >= 0:
                w = pending
                t, d = _scatter(out, t, d, dep_idx, last4, w, m, layout[w], scatter[w],
                                d_scatter[w], table[A_BWD, w, m])
                pending = -1
            if g >= 0:
                dep_idx[d] = g
                d += 1
            # ... and its input gradient in backward
            for j in range(nw):
                dep_idx[d] = wait[j]
                d += 1
            dep_idx[d] = table[A_FWD, u, m]
            d += 1
            for a in (A_PREFETCH, A_DECOMP):
                if table[a, u, m] >= 0:
                    dep_idx[d] = table[a, u, m]
                    d += 1
            b = t
            last4[lay, :3] = last4[lay, 1:].copy()
            last4[lay, 3] = t
            prev_compute = t
            compute_start = t
            t = _emit(out, t, d, K_BWD, u, m, R_COMPUTE, lay, tp_in[u], d_bwd[u], A_BWD, u)
            if scatter[u] > 0:
                pending = u
            for j in range(cb_ptr[u], cb_ptr[u + 1]):
                c = cb_copy[j]
                dep_idx[d] = b
                d += 1
                t = _emit(out, t, d, K_XFER, u, m, R_COPYBACK, c, copy_bytes[c], d_cpb[c],
                          A_GXFER, c)
            if k - 1 >= lo and off[S_units[k - 1]] > 0:
                v = S_units[k - 1]
                dep_idx[d] = table[A_OFFLOAD, v, m]
                dep_idx[d + 1] = -(b + 1)
                d += 2
                t = _emit(out, t, d, K_PREFETCH, v, m, R_H2D, layout[v], off[v],
                          off[v] * h2d[layout[v], 0] * host_scale[v] + h2d[layout[v], 1],
                          A_PREFETCH, v)
        if pending >= 0:
            t, d = _scatter(out, t, d, dep_idx, last4, pending, m, layout[pending],
                            scatter[pending], d_scatter[pending], table[A_BWD, pending, m])
        if m == final_mb[s]:   # DDP: all-reduce gradient buckets as backward produces them
            for bk in range(bk_ptr[s], bk_ptr[s + 1]):
                for j in range(bu_ptr[bk], bu_ptr[bk + 1]):
                    dep_idx[d] = table[A_BWD, bu_units[j], m]
                    d += 1
                lay = bk_lay[bk]
                last4[lay, :3] = last4[lay, 1:].copy()
                last4[lay, 3] = t
                t = _emit(out, t, d, K_ALLRED, bu_units[bu_ptr[bk + 1] - 1], m, R_COMM, lay,
                          bk_bytes[bk], d_ar[bk], -1, 0)
    for lay in range(n_layouts):
        for j in range(4):
            if last4[lay, j] >= 0:
                dep_idx[d] = last4[lay, j]
                d += 1
        t = _emit(out, t, d, K_OPT, -1, 0, R_COMPUTE, lay, 0.0, d_opt[lay], A_OPT, lay)
    kinds, units, mbs, roles, keys, works, durations, sets = out[:8]
    return (kinds[:t], units[:t], mbs[:t], roles[:t], keys[:t], works[:t], durations[:t],
            sets[:t], dep_ptr[:t + 1], dep_idx[:d], table)


def expand(S: Structure, timing: Timing, plan: StepBlocks) -> Tasks:
    """The tasks of one step: ``S`` with ``plan``'s side tasks and the recomputations of its
    segments, timed by ``timing``."""
    n = len(S.layout)
    segment = plan.segment
    seg_start = np.zeros(n, np.int64)
    seg_last = np.zeros(n, bool)
    if (segment >= 0).any():
        seg_start = plan.segment_start
        nxt = np.append(segment[1:], -1)
        seg_last = (segment >= 0) & (nxt != segment)
    off, comp = plan.offloaded, plan.compressed
    rd_ptr, rd = S.reads
    gi_ptr, gi = S.grads_in
    n_tasks, n_deps = _count(S.stage_units[0], S.stage_units[1], rd_ptr, gi_ptr,
                             S.copies_from[0], S.copies_back[0], seg_start, seg_last,
                             S.op_stage, S.op_back, len(S.bucket_units[1]),
                             len(S.bucket_layout), S.n_layouts)
    M = int(S.op_mb.max()) + 1
    out = _expand(n, M, S.n_layouts, len(S.copy_src), S.op_stage, S.op_back, S.op_mb,
                  S.stage_units[0], S.stage_units[1], S.final_mb, rd_ptr, rd[:, 0], rd[:, 1],
                  gi_ptr, gi[:, 0], gi[:, 1], S.copies_from[0], S.copies_from[1],
                  S.copies_back[0], S.copies_back[1], S.copy_src, S.copy_bytes, S.layout,
                  S.tp_out, S.tp_in, off, comp, seg_start, seg_last, S.buckets[0],
                  S.bucket_layout, S.bucket_bytes, S.bucket_units[0], S.bucket_units[1],
                  timing.forward,
                  timing.forward if timing.recompute is None else timing.recompute,
                  timing.backward, timing.allreduce, timing.copy,
                  timing.copy_back, timing.d2h, timing.h2d, timing.host_scale,
                  timing.optimizer, timing.compress, timing.decompress, S.gather, S.scatter,
                  timing.gather, timing.scatter, n_tasks, n_deps)
    return Tasks(*out)
