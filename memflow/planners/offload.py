"""Offloading saved tensors to host memory: vDNN's policies and two relaxation heuristics.

A unit with the ``offload`` policy copies what it saves to its host over the host link right
after its forward and frees the device copy when the copy ends; a ``prefetch`` brings it back,
issued when the backward of the unit before it (in backward order) starts, as vDNN does. The
simulator schedules both on the link's serial channels, so every policy below is timed with
its transfers overlapping (or not) the computation. Planners choose *what* to offload; *when*
is that schedule.

Policies (``offload(graph, cluster, policy=...)``):

* ``"none"`` — nothing (the reference).
* ``"all"`` — vDNN_all (Rhu et al., MICRO 2016): every unit offloads what it saves.
* ``"conv"`` — vDNN_conv: only convolution units (``kind`` containing ``Conv``).
* ``"dynamic"`` — vDNN_dyn: the first of none, conv, all that fits the memory limit (vDNN
  tries them in this order of expected speed; memflow has no choice of convolution
  algorithm, the other half of vDNN_dyn).
* ``"knapsack"`` and ``"fluid"`` — two heuristics after Beaumont, Eyraud-Dubois and Shilova
  (Euro-Par 2020), who choose what to offload from relaxations of the (NP-hard) exact problem.
  Both judge memory at its usual peak, the turn from forward to backward, so they must free
  ``E`` = peak − limit bytes; the simulator then checks memory over time and, if a peak
  elsewhere is still over, they choose again.

  - ``knapsack`` relaxes link contention: each transfer is hidden only by the compute around
    it — the prefetch of unit ``i`` by the backward of unit ``i+1``, the offload by everything
    between its forward and its backward. Exposed time per unit is what sticks out; a 0/1
    covering knapsack (``scipy.optimize.milp``) picks the set freeing ``E`` with the least
    exposed time. When the simulator finds a peak elsewhere (in backward, where gradients
    and the prefetched maps are live), the knapsack gains a covering row for that moment: only
    the units that the schedule would keep on the host then (offload done, prefetch not yet
    issued) count, and they must free the overshoot more than the current choice does there.
    Offloading a unit after the peak frees nothing at a backward peak, which ``E`` alone
    cannot tell.
  - ``fluid`` relaxes the transfers' timing: the host link is a fluid pipe, so a set hides
    behind the computation when, for every unit ``k``, the transfers of the chosen units from
    ``k`` on fit in the forward after ``k`` (offloads) and in the backward before ``k``
    (prefetches). Units are taken earliest first while the set still hides, then, if ``E`` is
    not reached, by least added overflow per byte. A peak elsewhere grows ``E`` by the
    overshoot.

>>> from memflow.search.synthetic import chain_graph
>>> g = chain_graph(6, width=4096, batch=16384, seed=None)    # keeping all peaks at 4.4 GiB
>>> offload(g, "1xV100-16GB", "dynamic").name
'no offload'
>>> offload(g, "1xV100-16GB", "dynamic", memory_limit="3GiB").policies
['offload', 'offload', 'offload', 'offload', 'offload', 'offload']
"""
from __future__ import annotations

import re
from typing import Any, Iterable

import numpy as np
import pandas as pd
from scipy.optimize import Bounds, LinearConstraint, milp

from ..errors import PlanError
from ..graph.units import LOSS
from ..strategy import Strategy
from ..sim import Evaluator, Outcome
from ..sim.kinds import K_BWD, K_FWD, K_OFFLOAD, K_PREFETCH
from .common import Infeasible, Profile, as_cluster, as_limit, check_graph, fastest

__all__ = ["offload", "offload_table", "knapsack_choice", "fluid_choice", "POLICIES"]

POLICIES = ("none", "all", "conv", "dynamic", "knapsack", "fluid")
_CONV = re.compile(r"Conv", re.I)
_REPAIRS = 12   # rounds of "simulate, grow E by the overshoot, choose again"


def knapsack_choice(prof: Profile, need: float, eligible: np.ndarray,
                    peaks: Iterable[tuple[np.ndarray, float]] = ()) -> np.ndarray:
    """Units (bool mask) freeing at least ``need`` bytes with the least exposed transfer time,
    each transfer hidden only by its neighbours' compute (no link contention).

    ``peaks`` adds covering rows ``(units, bytes)``: the chosen among ``units`` (a bool mask:
    those whose offload frees memory at some other peak) must free at least ``bytes``.

    >>> p = Profile(fwd=np.ones(4), bwd=np.full(4, 2.0), saved=np.array([4., 5., 1., 1.]),
    ...             d2h=1.0, h2d=1.0, latency=0.0)
    >>> knapsack_choice(p, 4.5, np.ones(4, bool)).tolist()
    [True, False, True, False]
    >>> knapsack_choice(p, 4.5, np.ones(4, bool), [(np.array([0, 1, 0, 0], bool), 5.0)]).tolist()
    [False, True, False, False]
    """
    n = len(prof.saved)
    c_off = prof.latency + prof.saved * prof.d2h
    c_pre = prof.latency + prof.saved * prof.h2d
    prev_bwd = np.append(prof.bwd[1:], 0.0)            # backward running while i prefetches
    after = np.cumsum((prof.fwd + prof.bwd)[::-1])[::-1] - (prof.fwd + prof.bwd)
    exposed = np.maximum(c_pre - prev_bwd, 0) + np.maximum(c_off - after, 0)
    # ties broken towards moving fewer bytes, then towards earlier units: the relaxation
    # ignores that a late offload queues behind earlier ones and frees its memory late
    cost = exposed + 1e-6 * (c_off + c_pre) * (1.0 + np.arange(n) / n) + 1e-12
    cost = np.where(eligible, cost, 0.0)
    rows = [(np.ones(n, bool), need)] + [(m, b) for m, b in peaks]
    rows = [(m & eligible, b) for m, b in rows if b > 0]
    if not rows:
        return np.zeros(n, bool)
    if any(prof.saved[m].sum() < b for m, b in rows):
        return eligible.copy()
    # bytes in units of each row's need (HiGHS misjudges feasibility with GiB-sized
    # coefficients), and a margin over its feasibility tolerance (1e-7), which would otherwise
    # accept a choice a few bytes short
    a = np.array([np.where(m, prof.saved, 0.0) / b for m, b in rows])
    res = milp(cost, integrality=np.ones(n), bounds=Bounds(0, eligible.astype(float)),
               constraints=LinearConstraint(a, lb=1.0 + 1e-6, ub=np.inf))
    if res.x is None:   # pragma: no cover - HiGHS solves every feasible covering knapsack
        raise PlanError(f"offload: the knapsack solver failed ({res.message})")
    return res.x > 0.5


def _overflow(prof: Profile, chosen: np.ndarray) -> float:
    """Seconds by which the chosen transfers overflow the fluid windows (forward + backward)."""
    c_off = np.where(chosen, prof.latency + prof.saved * prof.d2h, 0.0)
    c_pre = np.where(chosen, prof.latency + prof.saved * prof.h2d, 0.0)
    tail_off = np.cumsum(c_off[::-1])[::-1]         # transfers of units k..n-1
    tail_pre = np.cumsum(c_pre[::-1])[::-1]
    fwd_after = np.cumsum(prof.fwd[::-1])[::-1] - prof.fwd
    bwd_before = np.cumsum(prof.bwd[::-1])[::-1] - prof.bwd
    return float(np.max(np.maximum(tail_off - fwd_after, 0), initial=0.0)
                 + np.max(np.maximum(tail_pre - bwd_before, 0), initial=0.0))


def fluid_choice(prof: Profile, need: float, eligible: np.ndarray) -> np.ndarray:
    """Units (bool mask) freeing at least ``need`` bytes, earliest first while the transfers
    still fit the fluid windows, then by least added overflow per byte.

    >>> p = Profile(fwd=np.ones(4), bwd=np.full(4, 2.0), saved=np.array([1., 3., 1., 1.]),
    ...             d2h=1.0, h2d=1.0, latency=0.0)
    >>> fluid_choice(p, 2.0, np.ones(4, bool)).tolist()
    [True, False, True, False]
    """
    chosen = np.zeros(len(prof.saved), bool)
    got = 0.0
    for i in np.flatnonzero(eligible & (prof.saved > 0)):
        if got >= need:
            return chosen
        chosen[i] = True
        if _overflow(prof, chosen) > 0:
            chosen[i] = False
        else:
            got += prof.saved[i]
    while got < need:
        left = np.flatnonzero(eligible & ~chosen & (prof.saved > 0))
        if not len(left):
            break
        base = _overflow(prof, chosen)
        added = []
        for i in left:
            chosen[i] = True
            added.append((_overflow(prof, chosen) - base) / prof.saved[i])
            chosen[i] = False
        pick = left[int(np.argmin(added))]
        chosen[pick] = True
        got += prof.saved[pick]
    return chosen


class _Planner:
    def __init__(self, graph, cluster: Any, memory_limit: Any, base: Strategy | None,
                 optimizer: str):
        check_graph(graph, "offload")
        self.graph = graph
        self.cluster = as_cluster(cluster)
        self.base = base if base is not None else Strategy.single_device(
            graph, str(self.cluster.devices.index[0]))
        self.base.validate(graph, self.cluster)
        self.limit = as_limit(memory_limit, self.cluster, self.base.device_names)
        self.ev = Evaluator(graph, self.cluster, self.limit, optimizer=optimizer)
        u = graph.units
        # the loss runs in the user's training loop, not in the model: export keeps it
        self.eligible = (u["saved_bytes"].to_numpy() > 0) & (u.index != LOSS)
        self.conv = self.eligible & u["kind"].astype(str).str.contains(_CONV).to_numpy()

    def with_mask(self, mask: np.ndarray, name: str) -> Strategy:
        units = [u for u, m in zip(self.base.units, mask) if m]
        return self.base.with_policy(offload=units).with_schedule(name=name)

    def frees_at_peak(self, strategy: Strategy, chosen: np.ndarray) -> np.ndarray:
        """Units (bool mask) whose offload would keep their saved tensors off the device at the
        simulated peak of ``strategy`` (which offloads ``chosen``): their forward ended (their
        offload's end, if chosen) and their prefetch is not issued yet — for a unit not chosen,
        the prefetch vDNN's rule would issue at the start of the backward before its own.
        """
        run = self.ev.simulator.run(strategy)
        dev = run.device_class[run.devices_used]
        dev = dev[np.argmax(run.device.peak[dev])]
        when = run.device.time[run.device.peak_event[dev]]
        n = len(chosen)
        kind, unit = np.asarray(run.tasks.kind), np.asarray(run.tasks.unit)

        def at(k: int, t: np.ndarray, pick=np.minimum) -> np.ndarray:
            # per unit, the earliest (pick=np.minimum) or latest time ``t`` of its tasks of
            # kind ``k``, so that over micro-batches the window is the widest
            out = np.full(n, np.inf if pick is np.minimum else -np.inf)
            sel = kind == k
            pick.at(out, unit[sel], t[sel])
            return out

        fwd_end = at(K_FWD, run.end, np.maximum)
        bwd_start = at(K_BWD, run.start)
        # a prefetch is issued when the backward running just before the unit's own starts
        order = np.argsort(bwd_start, kind="stable")
        issue = bwd_start.copy()
        issue[order[1:]] = bwd_start[order[:-1]]
        gone = np.where(chosen, at(K_OFFLOAD, run.end, np.maximum), fwd_end)
        back = np.where(chosen, at(K_PREFETCH, run.start), issue)
        return (gone <= when) & (when < back)

    def static(self, policy: str) -> Strategy:
        mask = {"none": np.zeros_like(self.eligible), "all": self.eligible,
                "conv": self.conv}[policy]
        return self.with_mask(mask, "no offload" if policy == "none" else f"vDNN {policy}")

    def plan(self, policy: str) -> Outcome:
        if policy in ("none", "all", "conv"):
            return fastest(self.ev, [self.static(policy)], "offload", policy, self.limit)
        if policy == "dynamic":
            tried = []
            for p in ("none", "conv", "all"):
                out = self.ev(self.static(p))
                if out.fits:
                    return out
                tried.append(out)
            low = min(tried, key=lambda o: o.peak)
            raise Infeasible("offload", "dynamic", limit=self.limit, min_memory=low.peak,
                             best=low.strategy)
        if policy in ("knapsack", "fluid"):
            return self.heuristic(policy)
        raise PlanError(f"offload: unknown policy {policy!r}; valid: {', '.join(POLICIES)}")

    def heuristic(self, policy: str) -> Outcome:
        ref = self.ev(self.static("none"))
        if ref.fits:
            return ref
        prof = Profile.of(self.ev, self.base)
        need = ref.peak - self.limit
        seen, peaks = [ref], []
        for _ in range(_REPAIRS):
            if policy == "knapsack":
                mask = knapsack_choice(prof, need, self.eligible, peaks)
            else:
                mask = fluid_choice(prof, need, self.eligible)
            out = self.ev(self.with_mask(mask, f"offload {policy} (Beaumont et al. 2020)"))
            if out.fits:
                return out
            seen.append(out)
            if mask.sum() == self.eligible.sum():
                break
            over = max(out.peak - self.limit, 0.0) + 1.0
            if policy == "fluid":
                need += over
                continue
            frees = self.frees_at_peak(out.strategy, mask) & self.eligible
            peaks.append((frees, prof.saved[frees & mask].sum() + over))
            if prof.saved[frees].sum() < peaks[-1][1]:
                break       # offloading cannot lower that peak enough
        # offloading every unit is the choice both heuristics end at when nothing less fits
        return fastest(self.ev, [o.strategy for o in seen] + [self.static("all")], "offload",
                       policy, self.limit)


def offload(graph, cluster: Any, policy: str = "dynamic", *, memory_limit: Any = None,
            base: Strategy | None = None, optimizer: str = "sgd") -> Strategy:
    """A strategy that offloads saved tensors to host memory by ``policy`` (see the module).

    ``cluster`` is a :class:`~memflow.Cluster` or a preset name; the plan runs on its first
    device unless ``base`` (a strategy of ``graph``) gives the placement, to which only memory
    policies are added. ``memory_limit`` (bytes or a size string) defaults to the devices'
    capacity. The static policies (``none``, ``all``, ``conv``) and the others alike raise
    :class:`~memflow.planners.common.Infeasible` when the result does not fit.
    """
    if policy not in POLICIES:
        raise PlanError(f"offload: unknown policy {policy!r}; valid: {', '.join(POLICIES)}")
    return _Planner(graph, cluster, memory_limit, base, optimizer).plan(policy).strategy


def offload_table(graph, cluster: Any, policies: Iterable[str] = POLICIES, *,
                  memory_limit: Any = None, base: Strategy | None = None,
                  optimizer: str = "sgd") -> pd.DataFrame:
    """One row per policy: ``fits``, ``time``, ``peak``, ``offloaded`` (bytes moved to the
    host), ``loss`` (time over an ideal device with enough memory keeping everything, vDNN's
    measure) and the strategy's name. A policy that cannot fit shows its smallest peak.
    """
    p = _Planner(graph, cluster, memory_limit, base, optimizer)
    big = p.cluster.with_memory(1e18)
    ideal = Evaluator(graph, big, optimizer=optimizer)(p.static("none")).time
    rows = []
    for pol in policies:
        try:
            out, fits = p.plan(pol), True
        except Infeasible as exc:
            out, fits = (p.ev(exc.best) if exc.best is not None else None), False
        if out is None:
            rows.append({"policy": pol, "fits": False})
            continue
        moved = sum(float(b) for b, pol_ in zip(graph.units["saved_bytes"],
                                                out.strategy.policies) if pol_ == "offload")
        rows.append({"policy": pol, "fits": fits, "time": out.time, "peak": out.peak,
                     "offloaded": moved, "loss": out.time / ideal - 1.0,
                     "strategy": out.strategy.name})
    df = pd.DataFrame(rows).set_index("policy")
    df.attrs.update(limit=p.limit, ideal_time=ideal)
    return df
