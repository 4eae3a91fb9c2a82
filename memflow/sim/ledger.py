"""The memory ledger: every block allocated and freed at its task boundaries, per device class.

Blocks come from :func:`memflow.memory.plan.memory_plan` with anchors; :func:`anchor_tasks`
turns the anchors into task ids (per micro-batch), and :func:`ledger` sorts the allocations and
frees by time — frees at a boundary before the allocations of a task that starts there — and
accumulates them per device class (devices on the same placements have identical ledgers, so
each class is run once).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..memory.plan import CATEGORIES, EVERY_MB, MemoryPlan

__all__ = ["Ledger", "LedgerPlan", "anchor_tasks", "ledger_plan", "ledger"]


@dataclass
class Ledger:
    """Sorted memory events per class: running totals, peaks and what was live at each peak."""

    cls: np.ndarray          # event -> class
    time: np.ndarray
    task: np.ndarray         # task whose boundary the event is
    delta: np.ndarray
    category: np.ndarray
    total: np.ndarray        # bytes live on the class after the event (persistent included)
    persistent: np.ndarray   # (classes, categories)
    peak: np.ndarray         # per class
    peak_event: np.ndarray   # per class: index of the event reaching the peak (-1: none)
    final: np.ndarray        # per class: non-persistent bytes live at the end


def anchor_tasks(plan: MemoryPlan, anchor: dict, first_mb: dict, microbatches: int):
    """Expand blocks per micro-batch and resolve anchors to ``(alloc_key, free_key, block)``.

    Keys are ``task * 2 + edge`` so that sorting by (time, key) puts a task's start before its
    end, and the end of a task before the start of a later one at the same time.
    """
    M = microbatches
    every = plan.per_mb == EVERY_MB
    idx = np.concatenate([np.repeat(np.flatnonzero(every), M), np.flatnonzero(~every)])
    mb = np.concatenate([np.tile(np.arange(M), int(every.sum())),
                         np.zeros(int((~every).sum()), np.int64)])

    # dense lookup tables: (kind, key, microbatch) -> task, and (kind, key) -> first task
    n_kinds = 1 + max((k[0] for k in anchor), default=0)
    n_keys = 1 + max((k[1] for k in anchor), default=0)
    table = np.full((n_kinds, n_keys, M), -1, np.int64)
    if anchor:
        a = np.array(list(anchor), np.int64)
        table[a[:, 0], a[:, 1], a[:, 2]] = np.fromiter(anchor.values(), np.int64, len(anchor))
    first = np.full((n_kinds, n_keys), -1, np.int64)
    if first_mb:
        f = np.array(list(first_mb), np.int64)
        first[f[:, 0], f[:, 1]] = np.fromiter(first_mb.values(), np.int64, len(first_mb))
    pm = plan.per_mb[idx] == EVERY_MB

    def resolve(anch: np.ndarray) -> np.ndarray:
        kind, key, edge = anch[:, 0], anch[:, 1], anch[:, 2]
        tid = np.where(pm, table[kind, key, mb], first[kind, key])
        return tid * 2 + edge

    alloc = resolve(plan.alloc[idx])
    frees = np.stack([resolve(plan.free[idx, j]) for j in range(3)], 1)
    return alloc, frees, idx


@dataclass
class LedgerPlan:
    """The static part of a ledger: blocks expanded per class, before any timing."""

    alloc: np.ndarray        # per expanded block: key of its allocation
    frees: np.ndarray        # (k, 3) keys of its free anchors
    cls: np.ndarray
    nbytes: np.ndarray
    category: np.ndarray
    persistent: np.ndarray   # (classes, categories)


def ledger_plan(plan: MemoryPlan, alloc: np.ndarray, frees: np.ndarray, idx: np.ndarray,
                layout_classes: list[np.ndarray], n_classes: int, host: bool = False) -> LedgerPlan:
    """Expand blocks ``idx`` (device or host blocks) over the classes that hold them.

    ``layout_classes[L]`` lists the classes holding a part of placement ``L`` (for host blocks:
    the hosts, repeated once per device of ``L`` they serve).
    """
    lay = plan.layout[idx]
    counts = np.array([len(c) for c in layout_classes], np.int64)
    cls = np.concatenate([layout_classes[L] for L in lay]) if len(lay) else np.zeros(0, np.int64)
    b = np.repeat(np.arange(len(idx)), counts[lay])
    persistent = np.zeros((n_classes, len(CATEGORIES)))
    if not host:
        for L, cl in enumerate(layout_classes):
            np.add.at(persistent, cl, plan.persistent[L])
    return LedgerPlan(alloc=alloc[b], frees=frees[b], cls=cls.astype(np.int64),
                      nbytes=plan.bytes[idx][b], category=plan.category[idx][b],
                      persistent=persistent)


def ledger(lp: LedgerPlan, start: np.ndarray, end: np.ndarray) -> Ledger:
    """Run the expanded blocks against task times."""
    times = np.empty(2 * len(start))
    times[0::2], times[1::2] = start, end              # key -> time
    # rank every task boundary by (time, program order) once; events then sort by one integer
    boundary = np.lexsort((np.arange(len(times)), times))
    rank = np.empty(len(times), np.int64)
    rank[boundary] = np.arange(len(times))
    f_rank = rank[lp.frees]
    # freed at the latest anchor, and never before the end of the task that allocated it
    a_rank = rank[lp.alloc]
    f_rank = np.maximum(f_rank.max(1) if len(f_rank) else np.zeros(0, np.int64),
                        rank[np.minimum(lp.alloc + 1, len(times) - 1)])
    ev_cls = np.concatenate([lp.cls, lp.cls])
    ev_rank = np.concatenate([a_rank, f_rank])
    # an allocation and a free at the same boundary: the allocation first
    sort_key = (ev_cls * len(times) + ev_rank) * 2 + np.repeat([0, 1], len(lp.cls))
    order = np.argsort(sort_key, kind="stable")
    ev_cls = ev_cls[order]
    ev_key = boundary[ev_rank[order]]
    ev_time = times[ev_key]
    ev_delta = np.concatenate([lp.nbytes, -lp.nbytes])[order]
    ev_cat = np.concatenate([lp.category, lp.category])[order]
    n_classes = len(lp.persistent)
    base = lp.persistent.sum(1)
    run = np.cumsum(ev_delta)
    first = np.searchsorted(ev_cls, np.arange(n_classes))
    offset = np.concatenate([[0.0], run])[first]
    total = run - offset[ev_cls] + base[ev_cls]
    peak = base.copy()
    peak_event = np.full(n_classes, -1, np.int64)
    final = np.zeros(n_classes)
    if len(total):
        last = np.searchsorted(ev_cls, np.arange(n_classes), side="right") - 1
        has = np.flatnonzero(last >= first)
        top = np.maximum.reduceat(total, first[has])
        peak[has] = np.maximum(peak[has], top)
        # where: the first event of the class reaching its maximum
        hit = np.flatnonzero(total == top[np.searchsorted(has, ev_cls)])
        peak_event[has] = hit[np.searchsorted(ev_cls[hit], has)]
        final[has] = total[last[has]] - base[has]
    return Ledger(cls=ev_cls, time=ev_time, task=ev_key // 2, delta=ev_delta, category=ev_cat,
                  total=total, persistent=lp.persistent, peak=peak, peak_event=peak_event,
                  final=final)
