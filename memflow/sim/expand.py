"""Expand (graph, strategy, memory plan) into the tasks of one training step, in program order.

A task is one unit's work on all the parts of its placement at once (the parts run in
lockstep, as SPMD data- and tensor-parallel training does), or one transfer, collective,
offload, prefetch, compression or optimizer step. Tasks are listed in *program order*: the
order in which each device's streams issue them. The scheduler keeps that order on every
channel (as a CUDA stream does) and starts a task when its inputs are ready and its channels
are free.

Dependencies are task ids; ``-(j + 1)`` means "after task ``j`` *starts*" (a prefetch is issued
when the backward before it starts, one unit ahead, as vDNN does).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..memory.arrays import GraphArrays
from ..memory.plan import (A_BWD, A_COMPRESS, A_DECOMP, A_FWD, A_GXFER, A_OFFLOAD, A_OPT,
                           A_PREFETCH, A_RECOMP, A_XFER, MemoryPlan)
from .pipeline import program_order

__all__ = ["Tasks", "expand", "KINDS", "ROLES"]

KINDS = ("forward", "backward", "recompute", "transfer", "allreduce", "offload", "prefetch",
         "compress", "decompress", "optimizer")
K_FWD, K_BWD, K_RECOMP, K_XFER, K_ALLRED, K_OFFLOAD, K_PREFETCH, K_COMPRESS, K_DECOMP, K_OPT = \
    range(len(KINDS))
ROLES = ("compute", "comm", "to-host", "from-host", "copy", "copy-back")
R_COMPUTE, R_COMM, R_D2H, R_H2D, R_COPY, R_COPYBACK = range(len(ROLES))
BUCKET_CAP = 25 * 2 ** 20       # DDP's bucket_cap_mb
FIRST_BUCKET = 2 ** 20          # DDP's first bucket is small so communication starts early


@dataclass
class Tasks:
    """Tasks in program order (parallel lists) and where each memory anchor lands."""

    kind: list[int] = field(default_factory=list)
    unit: list[int] = field(default_factory=list)
    mb: list[int] = field(default_factory=list)
    role: list[int] = field(default_factory=list)
    key: list[int] = field(default_factory=list)      # layout, or copy id for copies
    work: list[float] = field(default_factory=list)   # bytes moved (compute: TP all-reduce)
    deps: list[list[int]] = field(default_factory=list)
    anchor: dict[tuple[int, int, int], int] = field(default_factory=dict)
    first_mb: dict[tuple[int, int], int] = field(default_factory=dict)  # (kind, key) -> task

    def add(self, kind: int, unit: int, mb: int, role: int, key: int, deps: list[int],
            work: float = 0.0, anchor: tuple[int, int] | None = None) -> int:
        tid = len(self.kind)
        self.kind.append(kind)
        self.unit.append(unit)
        self.mb.append(mb)
        self.role.append(role)
        self.key.append(key)
        self.work.append(work)
        self.deps.append(deps)
        if anchor is not None:
            self.anchor[(anchor[0], anchor[1], mb)] = tid
            self.first_mb.setdefault(anchor, tid)
        return tid


def _reads(ga: GraphArrays, layout: np.ndarray, plan: MemoryPlan) -> list[list[tuple[int, int]]]:
    """Per unit: anchors ``(A_FWD, producer)`` or ``(A_XFER, copy)`` its forward waits for."""
    copy_of = {(c.tensor, c.dst_layout): i for i, c in enumerate(plan.copies)}
    reads: list[list[tuple[int, int]]] = [[] for _ in range(ga.n)]
    for t in range(len(ga.bytes)):
        prod = int(ga.producer[t])
        for v in set(ga.readers[t]) | set(ga.savers[t]):
            if v == prod:
                continue
            ci = copy_of.get((t, int(layout[v])))
            if ci is not None:
                reads[v].append((A_XFER, ci))
            elif prod >= 0:
                reads[v].append((A_FWD, prod))
    return [sorted(set(r)) for r in reads]


def _grads_in(ga: GraphArrays, layout: np.ndarray, plan: MemoryPlan) -> list[list[tuple[int, int]]]:
    """Per unit: anchors ``(A_BWD, reader)`` or ``(A_GXFER, copy)`` its backward waits for."""
    copy_of = {(c.tensor, c.dst_layout): i for i, c in enumerate(plan.copies)}
    deps: list[set] = [set() for _ in range(ga.n)]
    last = ga.n - 1
    for t in range(len(ga.bytes)):
        prod = int(ga.producer[t])
        if prod < 0:
            continue
        if ga.is_output[t] and prod != last:
            deps[prod].add((A_FWD, last))
        for v in ga.readers[t]:
            ci = copy_of.get((t, int(layout[v])))
            deps[prod].add((A_GXFER, ci) if ci is not None and plan.copies[ci].grad
                           else (A_BWD, v))
    return [sorted(d) for d in deps]


def _buckets(ga: GraphArrays, layout: np.ndarray, part: np.ndarray, units: list[int]) -> list[list[int]]:
    """DDP buckets over ``units`` (backward order): ~1 MiB first, then ~25 MiB each."""
    out: list[list[int]] = []
    cur: list[int] = []
    size = 0.0
    for u in units:
        if ga.trainable_bytes[u] <= 0:
            continue
        cur.append(u)
        size += ga.trainable_bytes[u] / part[u]
        if size >= (FIRST_BUCKET if not out else BUCKET_CAP):
            out.append(cur)
            cur, size = [], 0.0
    if cur:
        out.append(cur)
    return out


def expand(ga: GraphArrays, strategy, plan: MemoryPlan, cache: dict | None = None) -> Tasks:
    """The tasks of one step of ``strategy`` on ``ga``'s graph, with ``plan``'s side tasks.

    ``cache`` (a dict the caller keeps) holds what depends on placements only, so strategies
    that differ in memory policies alone share it.
    """
    n, M = ga.n, strategy.microbatches
    layout = strategy.layout_ids
    degrees = np.array([k[:3] for k in strategy.layouts], np.int64)
    p = degrees[layout, 1]
    replicated = (degrees[:, 0] * degrees[:, 2]) > 1
    segment = strategy.segment
    stage = np.maximum(strategy.stage, 0)
    stages = int(stage.max()) + 1
    key = (layout.tobytes(), tuple(strategy.layouts), strategy.stage.tobytes(), M,
           strategy.schedule)
    placed = cache.get(key) if cache is not None else None
    if placed is None:
        placed = (_reads(ga, layout, plan), _grads_in(ga, layout, plan),
                  program_order(stages, M, strategy.schedule))
        if cache is not None:
            cache[key] = placed
    reads, grads_in, order_ops = placed
    out_bytes = np.zeros(n)
    in_grad_bytes = np.zeros(n)
    for t in range(len(ga.bytes)):
        prod = int(ga.producer[t])
        size = ga.bytes[t] / (M if ga.per_sample[t] else 1)
        if prod >= 0 and (ga.readers[t] or ga.is_output[t]):
            out_bytes[prod] += size
        if ga.requires_grad[t]:
            for v in ga.readers[t]:
                in_grad_bytes[v] += size
    sa = degrees[layout, 0] * degrees[layout, 2]
    tp_out = np.where(p > 1, out_bytes / sa, 0.0)
    tp_in = np.where(p > 1, in_grad_bytes / sa, 0.0)
    copies_from: dict[int, list[int]] = {}
    copies_back: dict[int, list[int]] = {}
    for ci, c in enumerate(plan.copies):
        prod = int(ga.producer[c.tensor])
        copies_from.setdefault(prod if prod >= 0 else c.first_reader, []).append(ci)
        if c.grad:
            copies_back.setdefault(c.first_reader, []).append(ci)
    seg_units: dict[int, list[int]] = {}
    for u in range(n):
        if segment[u] >= 0:
            seg_units.setdefault(int(segment[u]), []).append(u)
    by_stage = [np.flatnonzero(stage == s).tolist() for s in range(stages)]
    final_mb = {s: m for s, op, m in order_ops if op == "B"}

    # plain lists: the loops below read single elements, which numpy makes slow
    lay_l, seg_l = layout.tolist(), segment.tolist()
    off_l, comp_l = plan.offloaded.tolist(), plan.compressed.tolist()
    tpo_l, tpi_l = tp_out.tolist(), tp_in.tolist()
    T = Tasks()
    fwd_done: dict[tuple[int, int], int] = {}   # (unit, mb) -> task readers wait for
    bwd_done: dict[tuple[int, int], int] = {}

    def resolve(anchors: list[tuple[int, int]], m: int) -> list[int]:
        out = []
        for kind, key in anchors:
            if kind == A_FWD:
                out.append(fwd_done[(key, m)])
            elif kind == A_BWD:
                out.append(bwd_done[(key, m)])
            else:
                out.append(T.anchor[(kind, key, m)])
        return out

    for s, op, m in order_ops:
        units = by_stage[s]
        if op == "F":
            offloading: list[int] = []
            for u in units:
                lay = int(lay_l[u])
                # Megatron: a split unit all-reduces its output (work: bytes), synchronously;
                # vDNN: a forward waits for the previous unit's offload, which bounds memory
                f = T.add(K_FWD, u, m, R_COMPUTE, lay, resolve(reads[u], m) + offloading,
                          tpo_l[u], (A_FWD, u))
                done = fwd_done[(u, m)] = f
                offloading = []
                if off_l[u] > 0:
                    offloading = [T.add(K_OFFLOAD, u, m, R_D2H, lay, [f], off_l[u],
                                        (A_OFFLOAD, u))]
                if comp_l[u] > 0:
                    T.add(K_COMPRESS, u, m, R_COMPUTE, lay, [f], comp_l[u],
                          (A_COMPRESS, u))
                for ci in copies_from.get(u, ()):
                    c = plan.copies[ci]
                    src = [done] if ga.producer[c.tensor] >= 0 else []
                    T.add(K_XFER, u, m, R_COPY, ci, src, c.bytes, (A_XFER, ci))
            continue
        order = units[::-1]
        prev_compute: int | None = None
        for j, u in enumerate(order):
            lay = int(lay_l[u])
            wait = resolve(grads_in[u], m)
            if prev_compute is None and off_l[u] > 0:
                T.add(K_PREFETCH, u, m, R_H2D, lay, [T.anchor[(A_OFFLOAD, u, m)]],
                      off_l[u], (A_PREFETCH, u))
            if seg_l[u] >= 0 and (u + 1 >= n or seg_l[u + 1] != seg_l[u]):
                for v in seg_units[int(seg_l[u])]:
                    prev_compute = T.add(K_RECOMP, v, m, R_COMPUTE, lay, list(wait), tpo_l[v],
                                         (A_RECOMP, v))
            if comp_l[u] > 0:
                T.add(K_DECOMP, u, m, R_COMPUTE, lay, [T.anchor[(A_COMPRESS, u, m)]],
                      comp_l[u], (A_DECOMP, u))
            deps = wait + [fwd_done[(u, m)]]
            for kind in (A_PREFETCH, A_DECOMP):
                if (kind, u, m) in T.anchor:
                    deps.append(T.anchor[(kind, u, m)])
            # ... and its input gradient in backward
            b = T.add(K_BWD, u, m, R_COMPUTE, lay, deps, tpi_l[u], (A_BWD, u))
            prev_compute = done = bwd_done[(u, m)] = b
            for ci in copies_back.get(u, ()):
                T.add(K_XFER, u, m, R_COPYBACK, ci, [done], plan.copies[ci].bytes, (A_GXFER, ci))
            if j + 1 < len(order) and off_l[order[j + 1]] > 0:
                v = order[j + 1]
                T.add(K_PREFETCH, v, m, R_H2D, int(lay_l[v]),
                      [T.anchor[(A_OFFLOAD, v, m)], -(b + 1)], off_l[v],
                      (A_PREFETCH, v))
        if m == final_mb[s]:   # DDP: all-reduce gradient buckets as backward produces them
            for lay in sorted({int(lay_l[u]) for u in units}):
                if not replicated[lay]:
                    continue
                mine = [u for u in order if lay_l[u] == lay]
                for bucket in _buckets(ga, layout, p, mine):
                    size = float(sum(ga.trainable_bytes[u] / p[u] for u in bucket))
                    T.add(K_ALLRED, bucket[-1], m, R_COMM, lay,
                          [bwd_done[(u, m)] for u in bucket], size)
    n_layouts = len(degrees)
    last_of_layout: dict[int, list[int]] = {}
    for tid, (kind, role, key) in enumerate(zip(T.kind, T.role, T.key)):
        if role in (R_COMPUTE, R_COMM) and kind in (K_BWD, K_ALLRED):
            last_of_layout.setdefault(key, []).append(tid)
    for lay in range(n_layouts):
        T.add(K_OPT, -1, 0, R_COMPUTE, lay, last_of_layout.get(lay, [])[-4:],
              anchor=(A_OPT, lay))
    return T
