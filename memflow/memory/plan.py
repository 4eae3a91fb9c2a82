"""The memory model in one place: which storages exist, on which placement, from when to when.

``memory_plan`` turns (graph, policies, placements) into *blocks*: a number of bytes per part of
a placement (a *layout*: degrees + devices), a category, and the task boundaries ("anchors")
at which the block is allocated and freed. ``memflow.estimate`` runs the blocks against the
single-device program order; the simulator runs the same blocks against its schedule. The rules
are those of ``docs/data-model.md`` ("Memory model"), which follow PyTorch:

* weights, buffers, optimizer state and DDP gradient buckets are persistent;
* a parameter gradient lives from its unit's first backward to the end of the optimizer step;
* an activation storage lives from its producer's forward to the later of its last forward
  read, the start of backward (model outputs) and, when held for backward, the end of the
  backward of its first saver. Policies decide what *holds* it (keep > segment input >
  compress > offload > recompute);
* a storage read by a unit on another placement is copied there by a transfer, and that copy
  follows the same rules among the readers on that placement;
* activation gradients live from the backward of the last reader to the end of the
  producer's backward; forward and backward temporaries during their task.

Anchors are ``(kind, key, edge)``: ``kind`` one of the ``A_*`` codes, ``key`` a unit position
(or a copy number for transfers, a layout for the optimizer), ``edge`` 0 for the task's start
and 1 for its end.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..strategy.strategy import COMPRESS, KEEP, OFFLOAD, RECOMPUTE
from .arrays import GraphArrays

__all__ = ["MemoryPlan", "Copy", "memory_plan", "CATEGORIES", "OPTIMIZER_STATES",
           "A_FWD", "A_BWD", "A_RECOMP", "A_OFFLOAD", "A_PREFETCH", "A_COMPRESS", "A_DECOMP",
           "A_XFER", "A_GXFER", "A_OPT"]

CATEGORIES = ("weights", "gradients", "optimizer", "activations", "transient", "communication")
WEIGHTS, GRADIENTS, OPTIMIZER, ACTIVATIONS, TRANSIENT, COMMUNICATION = range(6)
OPTIMIZER_STATES = {"sgd": 0, "momentum": 1, "adam": 2}
"""Optimizer state per trainable byte."""

A_FWD, A_BWD, A_RECOMP, A_OFFLOAD, A_PREFETCH, A_COMPRESS, A_DECOMP, A_XFER, A_GXFER, \
    A_OPT = range(10)
START, END = 0, 1
FIRST_MB, EVERY_MB = 0, 1


@dataclass(frozen=True)
class Copy:
    """A storage copied from its producer's placement to the placement of some readers."""

    tensor: int
    src_layout: int
    dst_layout: int
    bytes: float            # per part of the destination placement
    first_reader: int       # the transfer must land before this unit's forward
    last_reader: int        # the gradient goes back after this unit's backward
    grad: bool


@dataclass
class MemoryPlan:
    """Blocks (one entry per block in each array) plus the copies between placements."""

    layout: np.ndarray
    on_host: np.ndarray
    bytes: np.ndarray
    category: np.ndarray
    per_mb: np.ndarray          # EVERY_MB: one block per micro-batch; FIRST_MB: one per step
    alloc: np.ndarray           # (k, 3) anchors
    free: np.ndarray            # (k, 3, 3) anchors: freed at the latest of the three
    copies: list[Copy]
    offloaded: np.ndarray       # per unit: bytes per part its offload task moves
    compressed: np.ndarray      # per unit: bytes per part its compress task reads
    persistent: np.ndarray      # (layouts, categories) bytes per part, whole step


class _Blocks:
    def __init__(self) -> None:
        self.rows: list[list] = []

    def add(self, layout, nbytes, cat, alloc, *frees, host=False, per_mb=EVERY_MB) -> int | None:
        """Add a block freed at the latest of ``frees`` (None entries ignored); its row."""
        if nbytes <= 0:
            return None
        frees = [f for f in frees if f is not None]
        self.rows.append([layout, host, nbytes, cat, per_mb, alloc,
                          (frees + [frees[0]] * 3)[:3]])
        return len(self.rows) - 1


@dataclass
class _Placed:
    """What the placements alone decide: per tensor its copies, sizes, anchors and gradients."""

    tensors: list[tuple]   # (prod, records, last transfer out, gradient rows)
    copies: list[Copy]


def _placements(ga: GraphArrays, lay_l: list[int], sa_l: list[float], p_l: list[int],
                M: int) -> _Placed:
    n, last = ga.n, ga.n - 1
    producer, nbytes_t = ga.producer.tolist(), ga.bytes.tolist()
    per_sample, is_output = ga.per_sample.tolist(), ga.is_output.tolist()
    requires_grad = ga.requires_grad.tolist()
    copies: list[Copy] = []
    out: list[tuple] = []
    for t in range(len(nbytes_t)):
        prod = producer[t]
        size = float(nbytes_t[t]) / (M if per_sample[t] else 1)
        readers, savers = ga.readers[t], ga.savers[t]
        users = sorted(set(readers) | set(savers) - {prod})
        home = lay_l[prod] if prod >= 0 else lay_l[users[0]] if users else -1
        if home < 0:
            continue
        groups: dict[int, list[int]] = {}
        for v in users:
            groups.setdefault(lay_l[v], []).append(v)
        groups = {home: groups.pop(home, []), **groups}   # the producer's placement first
        records, grads = [], []
        grad_sources: list[tuple[int, tuple]] = []   # (backward position, anchor)
        last_xfer = None
        for lay, members in groups.items():
            is_home = lay == home
            r = [v for v in readers if lay_l[v] == lay]
            sv = [v for v in savers if lay_l[v] == lay]
            ci = -1
            if is_home:
                share = 1.0 / sa_l[prod] if (prod >= 0 and per_sample[t]) else (
                    1.0 / sa_l[members[0]] if (members and per_sample[t]) else 1.0)
                if prod >= 0 and not readers and not is_output[t] and p_l[prod] > 1:
                    share /= p_l[prod]           # internal to a split unit: split too
                # a model input is present before the step starts
                alloc = (A_FWD, prod, START) if prod >= 0 else (A_FWD, min(members), START)
            else:
                share = 1.0 / sa_l[members[0]] if per_sample[t] else 1.0
                ci = len(copies)
                copies.append(Copy(t, home, lay, size * share, min(members), max(members),
                                   bool(requires_grad[t] and r)))
                alloc = (A_XFER, ci, START)
                last_xfer = (A_XFER, ci, END)
            nbytes = size * share
            fwd_last = max(r) if r else (prod if (is_home and prod >= 0) else min(members))
            model_out = is_home and bool(is_output[t])
            out_free = (A_BWD, last, START) if model_out else None
            records.append((lay, members, r, sv, is_home, nbytes, alloc, (A_FWD, fwd_last, END),
                            out_free))
            if requires_grad[t] and (r or model_out):   # the gradient of this copy
                g_alloc = (A_BWD, last, START) if model_out else (A_BWD, max(r), START)
                if is_home:
                    grad_sources.append((n if model_out else max(r), g_alloc))
                else:
                    grads.append([lay, False, nbytes, TRANSIENT, EVERY_MB, g_alloc,
                                  [(A_GXFER, ci, END)] * 3])
                    grad_sources.append((min(members), (A_GXFER, ci, START)))
        if grad_sources and requires_grad[t]:
            end = (A_BWD, prod if prod >= 0 else min(users), END)
            share = (1.0 / sa_l[prod] if prod >= 0 else 1.0 / sa_l[users[0]]) \
                if per_sample[t] else 1.0
            grads.append([home, False, size * share, TRANSIENT, EVERY_MB, max(grad_sources)[1],
                          [end] * 3])
        out.append((prod, records, last_xfer, [g for g in grads if g[2] > 0]))
    return _Placed(out, copies)


def memory_plan(ga: GraphArrays, policy: np.ndarray, segment: np.ndarray, layout: np.ndarray,
                degrees: np.ndarray, microbatches: int, ratio: np.ndarray, *,
                optimizer: str = "sgd", foreach: bool = True,
                cache: dict | None = None) -> MemoryPlan:
    """The blocks of one training step.

    ``degrees`` is ``(layouts, 3)``: sample, parameter, attribute of each layout; ``layout``,
    ``policy``, ``segment`` and ``ratio`` (compression ratio, used where ``policy`` is
    compress) are per unit. ``foreach`` selects PyTorch's multi-tensor optimizer kernels (the
    CUDA default: one optimizer-sized temporary for Adam) over the per-parameter loop (CPU).
    ``cache`` (a dict the caller keeps) holds what the placements alone decide, so strategies
    that differ in memory policies only share it.
    """
    n, M = ga.n, int(microbatches)
    s, p, a = degrees[layout, 0], degrees[layout, 1], degrees[layout, 2]
    sa = (s * a).astype(np.float64)
    blocks = _Blocks()
    offloaded = np.zeros(n)
    compressed = np.zeros(n)
    # plain lists: the loop below reads single elements, which numpy makes slow
    pol_l, seg_l, lay_l = policy.tolist(), segment.tolist(), layout.tolist()
    ratio_l = np.asarray(ratio, np.float64).tolist()
    key = (layout.tobytes(), degrees.tobytes(), M)
    placed = cache.get(key) if cache is not None else None
    if placed is None:
        placed = _placements(ga, lay_l, sa.tolist(), p.tolist(), M)
        if cache is not None:
            cache[key] = placed
    seg_first: dict[int, int] = {}
    for i, g in enumerate(seg_l):
        if g >= 0:
            seg_first.setdefault(g, i)
    rows = blocks.rows
    for prod, records, last_xfer, grads in placed.tensors:
        home_row = None
        for lay, members, r, sv, is_home, nbytes, alloc, fwd_free, out_free in records:
            # what holds it for backward
            pol = {pol_l[v] for v in sv}
            seg_in = [seg_first[seg_l[v]] for v in members
                      if seg_l[v] >= 0 and (prod < 0 or not is_home or seg_l[prod] != seg_l[v])]
            first_saver = min(sv) if sv else None
            if KEEP in pol or seg_in:
                state = KEEP
                hold_end = min(([first_saver] if first_saver is not None else []) + seg_in)
                row = blocks.add(lay, nbytes, ACTIVATIONS, alloc, (A_BWD, hold_end, END),
                                 out_free)
            elif COMPRESS in pol or OFFLOAD in pol:
                state = COMPRESS if COMPRESS in pol else OFFLOAD
                carrier = max(v for v in sv if pol_l[v] == state)
                go, back = (A_COMPRESS, A_DECOMP) if state == COMPRESS else (A_OFFLOAD, A_PREFETCH)
                stored = nbytes / ratio_l[carrier] if state == COMPRESS else nbytes
                (compressed if state == COMPRESS else offloaded)[carrier] += nbytes
                row = blocks.add(lay, nbytes, ACTIVATIONS, alloc, fwd_free, (go, carrier, END))
                blocks.add(lay, stored, ACTIVATIONS, (go, carrier, START), (back, carrier, END),
                           host=state == OFFLOAD)
                blocks.add(lay, nbytes, ACTIVATIONS, (back, carrier, START),
                           (A_BWD, first_saver, END))
            else:
                state = RECOMPUTE if RECOMPUTE in pol else None
                row = blocks.add(lay, nbytes, ACTIVATIONS, alloc, fwd_free, out_free)
            if is_home:
                home_row = row
            # re-materialized by its segment's recomputation
            if is_home and prod >= 0 and seg_l[prod] >= 0 and state in (RECOMPUTE, None):
                if state == RECOMPUTE:
                    end = (A_BWD, first_saver, END)
                else:
                    inside = [v for v in r if seg_l[v] == seg_l[prod]]
                    end = (A_RECOMP, max(inside) if inside else prod, END)
                blocks.add(lay, nbytes, ACTIVATIONS, (A_RECOMP, prod, START), end)
        if last_xfer is not None and home_row is not None:   # stays until every copy has left
            rows[home_row][6][2] = last_xfer
        rows.extend(grads)
    copies = placed.copies

    # temporaries of each unit's forward, backward and recomputation
    per = 1.0 / (s * p * a) / M
    for i in range(n):
        blocks.add(layout[i], ga.fwd_tmp[i] * per[i], TRANSIENT, (A_FWD, i, START), (A_FWD, i, END))
        blocks.add(layout[i], ga.bwd_tmp[i] * per[i], TRANSIENT, (A_BWD, i, START), (A_BWD, i, END))
        if segment[i] >= 0:
            blocks.add(layout[i], ga.fwd_tmp[i] * per[i], TRANSIENT, (A_RECOMP, i, START),
                       (A_RECOMP, i, END))
        blocks.add(layout[i], ga.trainable_bytes[i] / p[i], GRADIENTS, (A_BWD, i, START),
                   (A_OPT, int(layout[i]), END), per_mb=FIRST_MB)

    n_layouts = len(degrees)
    persistent = np.zeros((n_layouts, len(CATEGORIES)))
    train = ga.trainable_bytes / p
    np.add.at(persistent[:, WEIGHTS], layout, (ga.param_bytes + ga.buffer_bytes) / p)
    np.add.at(persistent[:, OPTIMIZER], layout, OPTIMIZER_STATES[optimizer] * train)
    np.add.at(persistent[:, COMMUNICATION], layout, np.where(sa > 1, train, 0.0))
    # optimizer-step temporaries: Adam's sqrt(v) buffer, all at once (foreach) or per tensor
    if optimizer == "adam":
        for lay in range(n_layouts):
            mine = train[layout == lay]
            tmp = mine.sum() if foreach else 2 * mine.max(initial=0.0)
            blocks.add(lay, tmp, TRANSIENT, (A_OPT, lay, START), (A_OPT, lay, END),
                       per_mb=FIRST_MB)

    k = len(rows)
    return MemoryPlan(
        layout=np.fromiter((r[0] for r in rows), np.int64, k),
        on_host=np.fromiter((r[1] for r in rows), bool, k),
        bytes=np.fromiter((r[2] for r in rows), np.float64, k),
        category=np.fromiter((r[3] for r in rows), np.int64, k),
        per_mb=np.fromiter((r[4] for r in rows), np.int64, k),
        alloc=np.array([r[5] for r in rows], np.int64).reshape(k, 3),
        free=np.array([r[6] for r in rows], np.int64).reshape(k, 3, 3),
        copies=copies, offloaded=offloaded, compressed=compressed, persistent=persistent)

