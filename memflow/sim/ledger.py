"""The memory ledger: every block allocated and freed at its task boundaries, per class.

Blocks come from :func:`memflow.memory.blocks.step_blocks` with anchors. Devices on the same
placements have identical ledgers, so each *class* of them is run once; host blocks land on
the hosts of the devices they come from. :func:`ledgers` resolves the anchors to task
boundaries per micro-batch, ranks the boundaries by time — a task's start before its end, the
end of a task before the start of a later one at the same time, frees at a boundary after the
allocations there — and sweeps the events in one compiled pass, devices and hosts together:
peak and final bytes per class. The sorted events (for ``SimResult.memory`` and the breakdown
at the peak) are made only when asked for.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..memory.jit import njit
from ..memory.blocks import CATEGORIES, EVERY_MB, StepBlocks
from .folding import rows_of

__all__ = ["Ledger", "LedgerPlan", "ledger_plan", "ledgers"]


@dataclass
class LedgerPlan:
    """Blocks of a plan (its fixed rows) and the classes each placement's blocks land on."""

    rows: dict[str, np.ndarray]
    device_ptr: np.ndarray     # CSR per layout: device classes holding its parts
    device_idx: np.ndarray
    host_ptr: np.ndarray       # CSR per layout: the host of each of its devices
    host_idx: np.ndarray
    persistent: np.ndarray     # (device classes, categories)
    n_hosts: int


def ledger_plan(plan: StepBlocks, layout_classes: list[np.ndarray], n_classes: int,
                layout_hosts: list[np.ndarray], n_hosts: int) -> LedgerPlan:
    """The blocks of ``plan`` over device classes and hosts.

    ``layout_classes[L]`` lists the device classes holding a part of placement ``L``;
    ``layout_hosts[L]`` the host of each of its devices (a host takes one copy per device).
    """
    ptr, cls = rows_of(layout_classes)
    return LedgerPlan(plan.rows, ptr, cls, *rows_of(layout_hosts),
                      _persistent(ptr, cls, plan.persistent, n_classes), n_hosts)


@njit
def _persistent(ptr, cls, per_layout, n_classes):
    """Per device class, the persistent bytes per category of the layouts it holds a part
    of (CSR ``ptr``, ``cls`` per layout), added layout by layout in the order one
    ``np.add.at`` per layout added them (the same bits), compiled: the ``np.add.at`` was
    most of a new placement's ledger plan."""
    out = np.zeros((n_classes, per_layout.shape[1]))
    for L in range(len(ptr) - 1):
        for j in range(ptr[L], ptr[L + 1]):
            for c in range(per_layout.shape[1]):
                out[cls[j], c] += per_layout[L, c]
    return out


@njit
def _run(layout, on_host, nbytes, per_mb, alloc, free, dev_ptr, dev_idx, host_ptr, host_idx,
         n_dev, n_hosts, table, first, start, end, base):
    """Instances (block, micro-batch, class) with their allocation and free ranks, the events
    in (rank, allocation-before-free) order, and each class's peak and final bytes. Host
    classes follow the device classes."""
    T2 = 2 * len(start)
    times = np.empty(T2)
    times[0::2] = start
    times[1::2] = end
    boundary = np.argsort(times, kind="mergesort")
    rank = np.empty(T2, np.int64)
    for i in range(T2):
        rank[boundary[i]] = i
    M = table.shape[2]
    total = 0
    for b in range(len(nbytes)):
        if nbytes[b] > 0:
            L = layout[b]
            k = host_ptr[L + 1] - host_ptr[L] if on_host[b] else dev_ptr[L + 1] - dev_ptr[L]
            total += (M if per_mb[b] == EVERY_MB else 1) * k
    cls = np.empty(total, np.int64)
    a_rank = np.empty(total, np.int64)
    f_rank = np.empty(total, np.int64)
    block = np.empty(total, np.int64)
    e = 0
    for b in range(len(nbytes)):
        if nbytes[b] <= 0:
            continue
        every = per_mb[b] == EVERY_MB
        for m in range(M if every else 1):
            if every:
                a_key = table[alloc[b, 0], alloc[b, 1], m] * 2 + alloc[b, 2]
            else:
                a_key = first[alloc[b, 0], alloc[b, 1]] * 2 + alloc[b, 2]
            # freed at the latest anchor, and never before the task that allocated it ends
            # (its end: key | 1; the next key is another task's start, which may run earlier)
            f = rank[a_key | 1]
            for j in range(3):
                if every:
                    key = table[free[b, j, 0], free[b, j, 1], m] * 2 + free[b, j, 2]
                else:
                    key = first[free[b, j, 0], free[b, j, 1]] * 2 + free[b, j, 2]
                f = max(f, rank[key])
            a = rank[a_key]
            L = layout[b]
            if on_host[b]:
                for c in range(host_ptr[L], host_ptr[L + 1]):
                    cls[e], a_rank[e], f_rank[e], block[e] = n_dev + host_idx[c], a, f, b
                    e += 1
            else:
                for c in range(dev_ptr[L], dev_ptr[L + 1]):
                    cls[e], a_rank[e], f_rank[e], block[e] = dev_idx[c], a, f, b
                    e += 1
    # counting sort of the events by (rank, allocation before free)
    count = np.zeros(2 * T2 + 1, np.int64)
    for i in range(total):
        count[2 * a_rank[i] + 1] += 1
        count[2 * f_rank[i] + 2] += 1
    for i in range(2 * T2):
        count[i + 1] += count[i]
    order = np.empty(2 * total, np.int64)
    for i in range(total):       # events 0..total-1 allocate, total.. free
        order[count[2 * a_rank[i]]] = i
        count[2 * a_rank[i]] += 1
    for i in range(total):
        order[count[2 * f_rank[i] + 1]] = total + i
        count[2 * f_rank[i] + 1] += 1
    running = np.zeros(n_dev + n_hosts)
    running[:n_dev] = base
    peak = running.copy()
    for j in range(2 * total):
        ev = order[j]
        if ev < total:
            c = cls[ev]
            running[c] += nbytes[block[ev]]
            if running[c] > peak[c]:
                peak[c] = running[c]
        else:
            c = cls[ev - total]
            running[c] -= nbytes[block[ev - total]]
    running[:n_dev] -= base
    return times, boundary, cls, a_rank, f_rank, block, order, peak, running


class Ledger:
    """One side's (devices' or hosts') peaks, computed at once, and its sorted events,
    computed on first use.

    Events are sorted by class, then by time: ``cls``, ``time``, ``task`` (whose boundary the
    event is), ``delta``, ``category``, ``total`` (bytes live on the class after the event,
    persistent included); ``peak_event`` is, per class, the first event reaching its peak
    (-1: none); ``final`` the non-persistent bytes live at the end.
    """

    def __init__(self, run: tuple, lp: LedgerPlan, lo: int, hi: int, persistent: np.ndarray):
        self._run, self._lp, self._lo, self._hi = run, lp, lo, hi
        self.persistent = persistent
        self.peak = run[7][lo:hi]
        self.final = run[8][lo:hi]

    @cached_property
    def _events(self) -> dict[str, np.ndarray]:
        times, boundary, cls, a_rank, f_rank, block, order, _, _ = self._run
        E = len(cls)
        ev_cls = np.concatenate([cls, cls])[order]
        order = order[(ev_cls >= self._lo) & (ev_cls < self._hi)]
        ev_cls = np.concatenate([cls, cls])[order] - self._lo
        order = order[np.argsort(ev_cls, kind="stable")]       # by class, keeping time order
        inst = order % E if E else order
        b = block[inst]
        out_cls = cls[inst] - self._lo
        rank = np.where(order < E, a_rank[inst], f_rank[inst])
        delta = np.where(order < E, 1.0, -1.0) * self._lp.rows["bytes"][b]
        key = boundary[rank]
        n_classes = self._hi - self._lo
        base = self.persistent.sum(1)
        total = np.empty(len(out_cls))
        peak_event = np.full(n_classes, -1, np.int64)
        first = np.searchsorted(out_cls, np.arange(n_classes))
        last = np.searchsorted(out_cls, np.arange(n_classes), side="right")
        for c in np.flatnonzero(last > first):
            # summed from the persistent bytes on, in the sweep's order: the same totals
            run = np.cumsum(np.concatenate([[base[c]], delta[first[c]:last[c]]]))[1:]
            total[first[c]:last[c]] = run
            hit = np.flatnonzero(run == self.peak[c])
            if len(hit):
                peak_event[c] = first[c] + hit[0]
        return {"cls": out_cls, "time": times[key], "task": key // 2, "delta": delta,
                "instance": inst,                       # an allocation and its free share it
                "category": self._lp.rows["category"][b], "total": total,
                "peak_event": peak_event}

    @property
    def cls(self) -> np.ndarray:
        return self._events["cls"]

    @property
    def time(self) -> np.ndarray:
        return self._events["time"]

    @property
    def task(self) -> np.ndarray:
        return self._events["task"]

    @property
    def delta(self) -> np.ndarray:
        return self._events["delta"]

    @property
    def instance(self) -> np.ndarray:
        return self._events["instance"]

    @property
    def category(self) -> np.ndarray:
        return self._events["category"]

    @property
    def total(self) -> np.ndarray:
        return self._events["total"]

    @property
    def peak_event(self) -> np.ndarray:
        return self._events["peak_event"]


def ledgers(lp: LedgerPlan, tasks, start: np.ndarray, end: np.ndarray) -> tuple[Ledger, Ledger]:
    """The device and host ledgers of the blocks of ``lp`` against the task times ``start``
    and ``end`` of ``tasks`` (whose anchor tables resolve the blocks' anchors)."""
    rows = lp.rows
    n_dev = len(lp.persistent)
    run = _run(rows["layout"], rows["host"], rows["bytes"], rows["per_mb"], rows["alloc"],
               rows["free"], lp.device_ptr, lp.device_idx, lp.host_ptr, lp.host_idx, n_dev,
               lp.n_hosts, tasks.table, tasks.first, start, end, lp.persistent.sum(1))
    return (Ledger(run, lp, 0, n_dev, lp.persistent),
            Ledger(run, lp, n_dev, n_dev + lp.n_hosts, np.zeros((lp.n_hosts, len(CATEGORIES)))))
