"""Pipelined model parallelism under memory constraints (Beaumont et al., Euro-Par 2021).

``pipeline(graph, cluster, memory_limit=..., microbatches=None, schedule="1f1b")`` cuts the
graph's units into one contiguous stage per device and picks the number of micro-batches so
that simulated throughput is highest while every stage fits its memory: stage ``s`` of ``P``
holds the activations of ``min(P − s, M)`` micro-batches under 1F1B and of all ``M`` under GPipe
(:mod:`memflow.planners.partition` solves the partition as an ILP with ``scipy.optimize.milp``,
falling back to an exact dynamic program). memflow's ``1f1b`` is the synchronous
PipeDream-flush schedule and ``gpipe`` flushes too, so both keep one version of the weights:
no weight stashing is needed (PipeDream's asynchronous 1F1B, which stashes up to ``P − s``
versions, is not a schedule memflow simulates).

Each candidate micro-batch count is solved on the model and run by the simulator; where the
simulated memory of a stage differs from the model's (which leaves out, e.g., when exactly
received tensors and gradients are freed), the solver runs again with the budgets corrected by
that difference. The fastest simulated candidate that fits is returned.

>>> from memflow.search.synthetic import chain_graph
>>> g = chain_graph(8, width=4096, batch=4096, seed=None)
>>> s = pipeline(g, "4xV100-16GB", microbatches=4)
>>> s.stage.tolist(), s.microbatches, s.schedule
([0, 0, 1, 1, 2, 2, 3, 3], 4, '1f1b')
"""
from __future__ import annotations

import math
from typing import Any, Iterable

import numpy as np
import pandas as pd

from ..errors import PlanError
from ..memory import OPTIMIZER_STATES
from ..sim import Evaluator, Outcome
from ..sim.kinds import K_BWD, K_FWD
from ..strategy import SCHEDULES, Strategy
from ..strategy.constructors import device_list
from .common import Infeasible, as_cluster, as_limit, check_graph, fastest
from .partition import Chain, in_flight, solve_dp, solve_milp, stage_memory

__all__ = ["pipeline", "pipeline_table", "chain_of", "SOLVERS"]

SOLVERS = ("milp", "dp")
_REPAIRS = 6
_MAX_MICROBATCHES = 64


def _crossing(graph) -> tuple[np.ndarray, np.ndarray]:
    """Bytes crossing a cut after each unit: (per-sample bytes, fixed bytes), ``n − 1`` each."""
    n = len(graph)
    pos = {u: i for i, u in enumerate(graph.names)}
    per, fixed = np.zeros(n), np.zeros(n)
    for t in graph.tensors.itertuples(index=False):
        users = [pos[u] for u in list(t.consumers) + list(t.savers)]
        if not users:
            continue
        first = pos.get(t.producer, 0)
        last = max(users)
        if last > first:
            (per if t.per_sample else fixed)[first:last] += t.bytes
    return per[:-1], fixed[:-1]


def chain_of(ev: Evaluator, devices: list[str], microbatches: int) -> Chain:
    """The partition model's figures for ``microbatches``, timed by the simulator on
    ``devices[0]`` (forward and backward of the first micro-batch of a one-device run)."""
    graph, M = ev.graph, microbatches
    one = Strategy.single_device(graph, devices[0]).with_schedule(microbatches=M)
    run = ev.simulator.run(one)
    kind, unit, mb = (np.asarray(a) for a in (run.tasks.kind, run.tasks.unit, run.tasks.mb))
    n = len(graph)
    time = np.zeros(n)
    pick = np.isin(kind, (K_FWD, K_BWD)) & (mb == 0)
    np.add.at(time, unit[pick], run.duration[pick])
    u = graph.units
    train = u["trainable_bytes"].to_numpy(np.float64)
    weights = (u["param_bytes"] + u["buffer_bytes"]).to_numpy(np.float64) \
        + train * (1 + OPTIMIZER_STATES[ev.simulator.optimizer])
    act = u["saved_bytes"].to_numpy(np.float64) / M
    tmp = (np.maximum(u["fwd_tmp_bytes"], u["bwd_tmp_bytes"]) + u["input_bytes"]
           + u["output_bytes"]).to_numpy(np.float64) / M
    per, fixed = _crossing(graph)
    ca = ev.cluster.arrays
    pos = ca.devices.get_indexer(devices)
    crossing = per / M + fixed
    cut = np.zeros(n - 1)
    for a, b in zip(pos, pos[1:]):      # the slowest link between neighbouring stages
        cut = np.maximum(cut, [ca.transfer_time(int(a), int(b), x) for x in crossing])
    return Chain(time, weights, act, tmp, cut)


def _candidates(batch: int, microbatches: int | Iterable[int] | None) -> list[int]:
    if microbatches is None:
        return [m for m in range(1, min(batch, _MAX_MICROBATCHES) + 1) if batch % m == 0]
    ms = [microbatches] if isinstance(microbatches, (int, np.integer)) else list(microbatches)
    bad = [m for m in ms if not isinstance(m, (int, np.integer)) or m < 1 or batch % m]
    if bad or not ms:
        raise PlanError(f"pipeline: microbatches={bad[0] if bad else ms!r} must divide the "
                        f"graph's batch size {batch}; valid: "
                        f"{[m for m in range(1, batch + 1) if batch % m == 0][:12]}")
    return [int(m) for m in ms]


class _Planner:
    def __init__(self, graph, cluster: Any, memory_limit: Any, stages: int | None,
                 schedule: str, solver: str, optimizer: str, time_limit: float):
        check_graph(graph, "pipeline")
        if schedule not in SCHEDULES:
            raise PlanError(f"pipeline: unknown schedule {schedule!r}; valid: "
                            f"{', '.join(SCHEDULES)}")
        if solver not in SOLVERS:
            raise PlanError(f"pipeline: unknown solver {solver!r}; valid: {', '.join(SOLVERS)}")
        self.graph, self.schedule, self.solver = graph, schedule, solver
        self.cluster = as_cluster(cluster)
        names = device_list(self.cluster)
        if stages is not None and not isinstance(stages, (int, np.integer)):
            raise PlanError(f"pipeline: stages must be a whole number of stages (or None for "
                            f"one per device), got {stages!r}")
        if not (isinstance(time_limit, (int, float)) and time_limit > 0):
            raise PlanError(f"pipeline: time_limit must be a positive number of seconds per "
                            f"ILP solve, got {time_limit!r}")
        P = len(names) if stages is None else int(stages)
        if not 1 <= P <= min(len(names), len(graph)):
            raise PlanError(f"pipeline: stages={stages} must be between 1 and "
                            f"{min(len(names), len(graph))} (devices: {len(names)}, units: "
                            f"{len(graph)})")
        self.devices = names[:P]
        self.limit = as_limit(memory_limit, self.cluster, self.devices)
        self.ev = Evaluator(graph, self.cluster, self.limit, optimizer=optimizer)
        self.time_limit = time_limit

    def solve(self, chain: Chain, limits: np.ndarray, flight: np.ndarray):
        if self.solver == "milp":
            got = solve_milp(chain, limits, flight, time_limit=self.time_limit)
            if got is not None:
                return got
        return solve_dp(chain, limits, flight)

    def strategy(self, stage: np.ndarray, M: int) -> Strategy:
        return Strategy(self.graph.names, devices=[(self.devices[s],) for s in stage],
                        stage=stage, microbatches=M, schedule=self.schedule,
                        name=f"pipeline {len(self.devices)} stages × {M} microbatches "
                             f"({self.schedule}, Beaumont et al. 2021)")

    def for_microbatches(self, M: int) -> list[Outcome]:
        """Simulated outcomes of the model's optimum for ``M``, recalibrated until it fits.

        After each simulation the model's error on that partition, stage by stage, moves the
        limits the solver sees (``limit + model − simulated``: looser where the model was
        pessimistic, tighter where it was optimistic); a partition seen twice that is still
        over has its budgets cut by the overshoot.
        """
        P = len(self.devices)
        chain = chain_of(self.ev, self.devices, M)
        flight = in_flight(P, M, self.schedule)
        where = self.cluster.devices.index.get_indexer(self.devices)
        limits = np.full(P, self.limit)
        outs: list[Outcome] = []
        seen: set[bytes] = set()
        for _ in range(_REPAIRS):
            got = self.solve(chain, limits, flight)
            stage = got[0] if got is not None else _least_memory(chain, flight)
            out = self.ev(self.strategy(stage, M))
            outs.append(out)
            if out.fits:
                break
            sim = out.peaks[where]
            if stage.tobytes() in seen:
                limits = limits - np.maximum(sim - self.limit, 0) - 1.0
            else:
                limits = self.limit + stage_memory(chain, stage, flight) - sim
            seen.add(stage.tobytes())
        return outs

    def plan(self, microbatches) -> Outcome:
        counts = _candidates(int(self.graph.meta["batch_size"]), microbatches)
        outs = [o for M in counts for o in self.for_microbatches(M)]
        if not any(o.fits for o in outs):
            low = min(outs, key=lambda o: o.peak)
            raise Infeasible("pipeline", self.schedule, limit=self.limit, min_memory=low.peak,
                             best=low.strategy)
        return fastest(self.ev, [o.strategy for o in outs], "pipeline", self.schedule,
                       self.limit)


def _least_memory(chain: Chain, flight: np.ndarray, rel: float = 0.01) -> np.ndarray:
    """The partition of (about) least model memory on its fullest stage, by bisection."""
    P = len(flight)
    hi = float(chain.weights.sum() + flight.max() * chain.act.sum() + chain.tmp.max())
    best, lo = solve_dp(chain, np.full(P, hi), flight), 0.0
    while hi - lo > rel * hi:
        mid = (lo + hi) / 2
        got = solve_dp(chain, np.full(P, mid), flight)
        if got is None:
            lo = mid
        else:
            best, hi = got, mid
    return best[0]


def pipeline(graph, cluster: Any, *, memory_limit: Any = None,
             microbatches: int | Iterable[int] | None = None, schedule: str = "1f1b",
             stages: int | None = None, solver: str = "milp", optimizer: str = "sgd",
             time_limit: float = 20.0) -> Strategy:
    """The fastest pipeline of ``graph`` on ``cluster`` within ``memory_limit`` per device.

    ``stages`` defaults to the cluster's number of devices (stage ``s`` on device ``s``);
    ``microbatches`` is a count, a list of counts to try, or None for every divisor of the
    batch size up to 64. ``solver="milp"`` (HiGHS, at most ``time_limit`` seconds per solve,
    then the DP) or ``"dp"``. Raises :class:`~memflow.planners.common.Infeasible` when no
    candidate fits.
    """
    return _Planner(graph, cluster, memory_limit, stages, schedule, solver, optimizer,
                    time_limit).plan(microbatches).strategy


def pipeline_table(graph, cluster: Any, *, memory_limit: Any = None,
                   microbatches: int | Iterable[int] | None = None,
                   schedules: Iterable[str] = SCHEDULES, stages: int | None = None,
                   solver: str = "milp", optimizer: str = "sgd") -> pd.DataFrame:
    """memflow's pipeline beside a FLOPs-balanced one (``Strategy.pipeline``) with the same
    micro-batches, per schedule: ``time``, ``peak``, ``fits``, ``microbatches`` and
    ``stages`` (units per stage)."""
    rows = []
    for sched in schedules:
        p = _Planner(graph, cluster, memory_limit, stages, sched, solver, optimizer, 20.0)
        try:
            out = p.plan(microbatches)
            M, fits = out.strategy.microbatches, True
        except Infeasible as exc:
            out, fits = p.ev(exc.best), False
            M = out.strategy.microbatches
        naive = p.ev(Strategy.pipeline(graph, p.devices, stages=len(p.devices),
                                       microbatches=M, schedule=sched))
        for who, o, ok in (("memflow", out, fits), ("balanced by FLOPs", naive, naive.fits)):
            rows.append({"schedule": sched, "plan": who, "microbatches": M, "fits": ok,
                         "time": o.time, "peak": o.peak,
                         "stages": np.bincount(o.strategy.stage).tolist()})
    df = pd.DataFrame(rows).set_index(["schedule", "plan"])
    df.attrs["limit"] = p.limit if rows else math.nan
    return df
