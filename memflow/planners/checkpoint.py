"""Checkpointing on one device: which units keep what they save and which recompute it.

``checkpoint(graph, device, memory_limit, method)`` returns the fastest strategy of a method
that fits the limit, simulated by memflow's simulator; :func:`checkpoint_table` gives, per
method, the smallest memory at which training still runs and what it costs — the edge
scenario when ``device`` is an edge board such as ``"jetson-nano-4GB"``.

What memflow can express, and so what each method becomes here: a unit either keeps its saved
tensors or recomputes them; consecutive recomputed units form one segment that runs like one
``torch.utils.checkpoint(use_reentrant=False)`` call (its inputs held, its forward re-run once
just before its backward). There is one level of recomputation: a recomputed unit runs at most
twice. Every method below therefore chooses a set of *kept* units; the others recompute, and the
kept units cut the chain into segments.

* ``"all"`` — recompute everything: one segment, ``checkpoint(model)``. It holds the least
  between forward and backward but re-materializes every saved tensor before the backward, so
  its peak is about that of keeping everything; it is listed as the baseline it is.
* ``"sqrt"`` — Chen et al. (2016), "Training deep nets with sublinear memory cost", section
  4.3: walk the chain adding each unit's saved bytes; when the running sum passes a budget
  ``B`` the unit becomes a checkpoint (kept) and the sum restarts. ``B`` is searched over a
  geometric grid (Chen's "√n" choice is the grid's low-memory end for a uniform chain); the
  fastest plan within the limit is returned.
* ``"revolve"`` — Griewank & Walther's binomial checkpointing (``revolve``, ACM TOMS 2000)
  with ``c`` snapshots over the units taken as uniform steps: the states its first forward
  sweep stores (its ``advance`` rule; state ``i`` is the input of unit ``i``) make units ``i``
  kept, which holds their input as revolve holds the state. revolve's later sweeps, which
  recompute a step several times, cannot be expressed: each stretch between snapshots is
  recomputed once as one segment. ``c`` is searched.
* ``"optimal"`` — :func:`memflow.planners.checkpointing.optimal_checkpointing`: the least-time
  assignment of keep and recompute that fits, over exactly the schedules above (an exact
  dynamic program over segmentations, after rotor), for graphs that are chains (capture with
  ``units="blocks"``). Its smallest memory is the DP's own least-peak schedule, so the
  ``Infeasible`` it raises gives the least memory any such schedule reaches.

Units that the graph marks not recomputable (a ``recomputable`` column) are always kept.

>>> from memflow.search.synthetic import chain_graph
>>> g = chain_graph(9, width=4096, batch=16384, seed=None)    # 9 layers, 512 MiB saved each
>>> s = checkpoint(g, "1xV100-16GB", "4GiB", method="sqrt")
>>> "".join("K" if p == "keep" else "r" for p in s.policies)
'rrKrrKrrK'
>>> checkpoint(g, "1xV100-16GB", "3GiB", method="sqrt")
Traceback (most recent call last):
...
memflow.planners.common.Infeasible: checkpoint: no 'sqrt' strategy fits memory_limit=3.00 GiB; the smallest peak found is 3.44 GiB; give memory_limit >= 3.44 GiB (3691167744 bytes)
"""
from __future__ import annotations

import math
from typing import Any, Iterable

import numpy as np
import pandas as pd

from ..errors import PlanError, SearchError
from ..sim import Evaluator, Outcome
from ..strategy import Strategy
from .checkpointing import chain_violation, optimal_checkpointing
from .common import Infeasible, as_cluster, as_limit, check_graph, fastest

__all__ = ["checkpoint", "checkpoint_table", "chen_checkpoints", "revolve_snapshots", "METHODS"]

METHODS = ("optimal", "sqrt", "revolve", "all")
_GRID = 24   # budgets / snapshot counts tried per method


def chen_checkpoints(saved: Iterable[float], budget: float) -> np.ndarray:
    """Chen et al.'s greedy: positions whose running saved bytes pass ``budget`` (kept).

    >>> chen_checkpoints([1, 1, 1, 1, 1, 1], 2).tolist()
    [2, 5]
    """
    out, run = [], 0.0
    for i, b in enumerate(saved):
        run += float(b)
        if run > budget:
            out.append(i)
            run = 0.0
    return np.asarray(out, np.int64)


def revolve_snapshots(steps: int, snaps: int) -> list[int]:
    """States that revolve's first forward sweep stores, for ``steps`` uniform steps and
    ``snaps`` snapshots (state ``i`` is the input of step ``i``; state 0 is always stored).

    This is the ``advance`` rule of Griewank & Walther's Algorithm 799, in integer arithmetic
    as there.

    >>> revolve_snapshots(10, 2), revolve_snapshots(5, 9), revolve_snapshots(7, 1)
    ([0, 6], [0, 1, 2, 3, 4], [0])
    """
    if steps < 1 or snaps < 1:
        raise PlanError(f"revolve needs steps >= 1 and snaps >= 1, got {steps} and {snaps}")
    capo, check, out = 0, 0, [0]
    while check + 1 < snaps and capo < steps - 1:
        ds = snaps - check
        reps, rng = 0, 1
        while rng < steps - capo:
            reps += 1
            rng = rng * (reps + ds) // reps
        bino1 = rng * reps // (ds + reps)
        bino2 = bino1 * ds // (ds + reps - 1) if ds > 1 else 1
        bino3 = 0 if ds == 1 else (bino2 * (ds - 1) // (ds + reps - 2) if ds > 2 else 1)
        bino4 = bino2 * (reps - 1) // ds
        bino5 = 0 if ds < 3 else (bino3 * (ds - 2) // reps if ds > 3 else 1)
        old = capo
        if steps - capo <= bino1 + bino3:
            capo = old + bino4
        elif steps - capo >= rng - bino5:
            capo = old + bino1
        else:
            capo = steps - bino2 - bino3
        capo = max(capo, old + 1)
        check += 1
        out.append(capo)
    return out


class _Planner:
    """The kept sets of every method, turned into strategies and simulated."""

    def __init__(self, graph, device: Any, memory_limit: Any, optimizer: str,
                 slots: int | str | None = "auto"):
        check_graph(graph, "checkpoint")
        self.slots = slots
        self.graph = graph
        self.cluster = as_cluster(device, "device")
        self.device = str(self.cluster.devices.index[0])
        self.limit = as_limit(memory_limit, self.cluster, [self.device])
        self.optimizer = optimizer
        self.ev = Evaluator(graph, self.cluster, self.limit, optimizer=optimizer)
        self.base = Strategy.single_device(graph, self.device)
        u = graph.units
        self.must_keep = (~u["recomputable"].to_numpy(bool) if "recomputable" in u.columns
                          else np.zeros(len(u), bool))
        self.saved = u["saved_bytes"].to_numpy(np.float64)

    def strategy(self, kept: Iterable[int], name: str) -> Strategy:
        keep = self.must_keep.copy()
        keep[np.asarray(list(kept), np.int64)] = True
        rec = [u for u, k in zip(self.base.units, keep) if not k]
        return self.base.with_policy(recompute=rec).with_schedule(name=name)

    def candidates(self, method: str) -> list[Strategy]:
        n = len(self.graph)
        if method == "all":
            return [self.strategy([], "recompute all")]
        kept: dict[tuple, str] = {}     # kept set -> name of its first parameter
        if method == "sqrt":
            pos = self.saved[self.saved > 0]
            lo, hi = (pos.min(), pos.sum()) if len(pos) else (1.0, 1.0)
            for b in np.unique(np.geomspace(lo, max(hi, lo), _GRID)):
                kept.setdefault(tuple(chen_checkpoints(self.saved, b)),
                                f"sqrt (Chen et al., budget {b / 2**20:.4g} MiB)")
        elif method == "revolve":
            for c in np.unique(np.geomspace(1, n, _GRID).round().astype(int)):
                kept.setdefault(tuple(revolve_snapshots(n, int(c))),
                                f"revolve ({int(c)} snapshots)")
        else:
            raise PlanError(f"checkpoint: unknown method {method!r}; valid: "
                            f"{', '.join(METHODS)}")
        return [self.strategy(k, name) for k, name in kept.items()]

    def _optimal(self, least: str) -> Outcome | None:
        """The optimal schedule: the fastest within the limit (None when none fits), or for
        ``least="memory"`` the fastest of least peak, fitting or not."""
        why = chain_violation(self.graph)
        if why is not None:
            raise PlanError(f"checkpoint: method 'optimal' applies to chains only, and here "
                            f"{why}; capture with units='blocks' or use another method")
        try:
            res = optimal_checkpointing(self.graph, self.cluster, self.limit, least=least,
                                        optimizer=self.optimizer, slots=self.slots)
        except SearchError as exc:
            if least == "time":      # nothing fits the limit
                return None
            raise PlanError(f"checkpoint: {exc}") from None
        out = self.ev(res.strategy)
        return out if least == "memory" or out.fits else None

    def plan(self, method: str) -> Outcome:
        if method != "optimal":
            return fastest(self.ev, self.candidates(method), "checkpoint", method, self.limit)
        out = self._optimal("time")
        if out is None:
            low = self.lowest(method)
            raise Infeasible("checkpoint", "optimal", limit=self.limit, min_memory=low.peak,
                             best=low.strategy)
        return out

    def lowest(self, method: str) -> Outcome:
        """The candidate of ``method`` with the smallest peak (ties: fastest)."""
        if method == "optimal":
            return self._optimal("memory")
        outs = [self.ev(s) for s in self.candidates(method)]
        return min(outs, key=lambda o: (o.peak, o.time))


def checkpoint(graph, device: Any, memory_limit: Any = None, method: str = "sqrt", *,
               optimizer: str = "sgd", slots: int | str | None = "auto") -> Strategy:
    """The fastest ``method`` checkpointing strategy of ``graph`` on one device within
    ``memory_limit`` (bytes or a size string; default the device's capacity).

    ``device`` is a cluster preset name (``"jetson-nano-4GB"``, ``"1xV100-16GB"``) or a
    :class:`~memflow.Cluster`, whose first device is used. ``method`` is one of ``"optimal"``,
    ``"sqrt"``, ``"revolve"``, ``"all"`` (see the module). Raises
    :class:`~memflow.planners.common.Infeasible` with the smallest memory the method reaches when
    it cannot fit. ``slots`` is passed to ``optimal_checkpointing``: it cuts memory into
    slots of ``limit / slots`` as rotor does, which bounds the work on long chains (500 slots:
    a 100-unit chain in a fraction of a second); ``"auto"`` is exact up to 40 units, None
    always exact.
    """
    if method not in METHODS:
        raise PlanError(f"checkpoint: unknown method {method!r}; valid: {', '.join(METHODS)}")
    return _Planner(graph, device, memory_limit, optimizer, slots).plan(method).strategy


def checkpoint_table(graph, device: Any, methods: Iterable[str] = METHODS, *,
                     memory_limit: Any = None, optimizer: str = "sgd",
                     slots: int | str | None = "auto") -> pd.DataFrame:
    """Per method: the smallest peak memory at which training still runs, its time, and the
    fastest plan within ``memory_limit`` (default the device's capacity).

    Rows: ``keep all`` and each method. Columns: ``min_memory`` (bytes), ``time_at_min`` (s),
    ``overhead_at_min`` (time over keep-all's, e.g. 0.3 = 30% slower), ``fits`` (a plan within
    the limit exists), ``time`` and ``peak`` of the fastest such plan, ``strategy`` (its name).
    A method that cannot run (``optimal`` on a graph that is not a chain) gets ``NaN`` and
    its reason in ``strategy``. ``slots`` as for :func:`checkpoint`.
    """
    p = _Planner(graph, device, memory_limit, optimizer, slots)
    ref = p.ev(p.base)
    rows = [{"method": "keep all", "min_memory": ref.peak, "time_at_min": ref.time,
             "fits": ref.fits, "time": ref.time if ref.fits else math.nan,
             "peak": ref.peak, "strategy": p.base.name}]
    for m in methods:
        row: dict[str, Any] = {"method": m}
        try:
            low = p.lowest(m)
        except PlanError as exc:
            rows.append(row | {"fits": False, "strategy": str(exc)})
            continue
        row.update(min_memory=low.peak, time_at_min=low.time)
        try:
            best = p.plan(m)
            row.update(fits=True, time=best.time, peak=best.peak, strategy=best.strategy.name)
        except Infeasible:
            row.update(fits=False, time=math.nan, peak=math.nan, strategy="")
        rows.append(row)
    df = pd.DataFrame(rows).set_index("method")
    df.insert(2, "overhead_at_min", df["time_at_min"] / ref.time - 1.0)
    df.attrs.update(limit=p.limit, device=p.cluster.name, keep_all_time=ref.time)
    return df
