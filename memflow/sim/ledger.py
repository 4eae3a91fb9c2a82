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

__all__ = ["Ledger", "anchor_tasks", "ledger"]


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

    def resolve(anch: np.ndarray, per_mb: np.ndarray) -> np.ndarray:
        out = np.empty(len(anch), np.int64)
        for r, ((kind, key, edge), m, pm) in enumerate(zip(anch.tolist(), mb.tolist(),
                                                            per_mb.tolist())):
            tid = anchor[(kind, key, m)] if pm == EVERY_MB else first_mb[(kind, key)]
            out[r] = tid * 2 + edge
        return out

    pm = plan.per_mb[idx]
    alloc = resolve(plan.alloc[idx], pm)
    frees = np.stack([resolve(plan.free[idx, j], pm) for j in range(3)], 1)
    return alloc, frees, idx


def ledger(plan: MemoryPlan, alloc: np.ndarray, frees: np.ndarray, idx: np.ndarray,
           start: np.ndarray, end: np.ndarray, layout_classes: list[np.ndarray],
           n_classes: int, host: bool = False) -> Ledger:
    """Run the blocks ``idx`` (device or host blocks) against task times.

    ``layout_classes[L]`` lists the classes holding a part of placement ``L`` (for host blocks:
    the hosts, repeated once per device of ``L`` they serve).
    """
    times = np.stack([start, end], 1).ravel()      # key -> time
    a_time = times[alloc]
    f_time = times[frees]
    # the latest anchor; at equal times the one later in program order
    latest = f_time.max(1) if len(f_time) else np.zeros(0)
    f_key = np.where(f_time == latest[:, None], frees, -1).max(1)
    f_time = np.maximum(latest, a_time)
    f_key = np.maximum(f_key, alloc + 1)
    lay = plan.layout[idx]
    counts = np.array([len(c) for c in layout_classes], np.int64)
    rep = counts[lay]
    cls = np.concatenate([layout_classes[L] for L in lay]) if len(lay) else np.zeros(0, np.int64)
    b = np.repeat(np.arange(len(idx)), rep)
    nbytes = plan.bytes[idx][b]
    cat = plan.category[idx][b]
    ev_cls = np.concatenate([cls, cls])
    ev_time = np.concatenate([a_time[b], f_time[b]])
    ev_key = np.concatenate([alloc[b], f_key[b]])
    ev_delta = np.concatenate([nbytes, -nbytes])
    ev_cat = np.concatenate([cat, cat])
    order = np.lexsort((ev_key, ev_time, ev_cls))
    ev_cls, ev_time, ev_key, ev_delta, ev_cat = (x[order] for x in
                                                 (ev_cls, ev_time, ev_key, ev_delta, ev_cat))
    persistent = np.zeros((n_classes, len(CATEGORIES)))
    if not host:
        for L, cl in enumerate(layout_classes):
            np.add.at(persistent, cl, plan.persistent[L])
    run = np.cumsum(ev_delta)
    first = np.searchsorted(ev_cls, np.arange(n_classes))
    offset = np.concatenate([[0.0], run])[first]
    total = run - offset[ev_cls] + persistent.sum(1)[ev_cls]
    peak = persistent.sum(1).copy()
    peak_event = np.full(n_classes, -1, np.int64)
    final = np.zeros(n_classes)
    if len(total):
        last = np.searchsorted(ev_cls, np.arange(n_classes), side="right") - 1
        has = last >= first
        # peak and where: the first event reaching the class maximum
        order2 = np.lexsort((np.arange(len(total)), -total, ev_cls))
        top = order2[np.searchsorted(ev_cls[order2], np.arange(n_classes))[has]]
        peak[has] = np.maximum(peak[has], total[top])
        peak_event[has] = top
        final[has] = total[last[has]] - persistent.sum(1)[has]
    return Ledger(cls=ev_cls, time=ev_time, task=ev_key // 2, delta=ev_delta, category=ev_cat,
                  total=total, persistent=persistent, peak=peak, peak_event=peak_event,
                  final=final)
