"""Stand-ins for the parts of memflow's core that have not landed yet (simulator and search).

They follow docs/data-model.md (SimResult's frames, MCMCSearch's history columns) and issue 4's
MCMCSearch API, and use the real OpGraph and Strategy. Each goes as soon as the real object
exists: ``sim_result`` → ``memflow.simulate``, ``StandInSearch`` → ``memflow.MCMCSearch``.
"""
from __future__ import annotations

import time
import types

import numpy as np
import pandas as pd

import memflow

CATEGORIES = ["weights", "gradients", "optimizer", "activations", "transient", "communication"]
GIB = 2**30


def sim_result(graph, strategy, *, capacity: float = 16 * GIB, scale: float = 1.0):
    """A SimResult-shaped namespace: forward then backward of every unit on each device."""
    devs = sorted(strategy.device_names) or ["gpu0"]
    pol = dict(zip(strategy.units, strategy.policies))
    tl, mem = [], []
    for d in devs:
        t, act, w = 0.0, 0.0, float(GIB)
        base = dict(device=d, weights=w, optimizer=2 * w, transient=0.0, communication=0.0)
        mem.append({**base, "time": 0.0, "gradients": 0.0, "activations": 0.0})
        for u in graph.names:
            dt = 0.004
            tl.append(dict(task=f"forward {u} @{d}", kind="forward", unit=u, resource=d,
                           start=t, end=t + dt, bytes=0))
            t += dt
            act += 0.0 if pol[u] == "recompute" else scale * GIB
            mem.append({**base, "time": t, "gradients": 0.0, "activations": act})
        for i, u in enumerate(reversed(graph.names)):
            tl.append(dict(task=f"backward {u} @{d}", kind="backward", unit=u, resource=d,
                           start=t, end=t + 0.008, bytes=0))
            t += 0.008
            act = max(0.0, act - (0.0 if pol[u] == "recompute" else scale * GIB))
            mem.append({**base, "time": t, "gradients": w * (i + 1) / len(graph),
                        "activations": act})
        tl.append(dict(task=f"allreduce @{d}", kind="allreduce", unit=None,
                       resource=f"nvlink {d}", start=t - 0.01, end=t, bytes=w))
    mem = pd.DataFrame(mem)
    mem["bytes"] = mem[CATEGORIES].sum(axis=1)
    tl = pd.DataFrame(tl)
    cap = pd.Series(float(capacity), index=pd.Index(devs, name="device"))
    peak = mem.groupby("device")["bytes"].max()
    step = float(tl["end"].max())
    return types.SimpleNamespace(memory=mem, timeline=tl, iteration_time=step,
                                 throughput=32 / step, peak_memory=peak, capacity=cap,
                                 feasible=bool((peak <= cap).all()),
                                 over_capacity=list(peak.index[peak > cap]))


class StandInSearch:
    """Random policy moves with MCMCSearch's interface: step, history, best, pins …"""

    def __init__(self, graph, devices=("gpu0", "gpu1"), *, seed: int = 0,
                 step_seconds: float = 0.0, fail_at: int | None = None):
        self.graph = graph
        self.rng = np.random.default_rng(seed)
        self.step_seconds = step_seconds
        self.fail_at = fail_at
        self.current = memflow.Strategy.data_parallel(graph, list(devices))
        self.best = self.current
        self.pins: dict[str, str] = {}
        self.strategies: list = []            # the current strategy after every step
        self._rows: list[dict] = []
        self._best_cost = np.inf
        self.best_result = sim_result(graph, self.best)

    def _cost(self, strategy) -> float:
        return 1.0 + sum(p == "keep" for p in strategy.policies) / len(strategy) \
            + 0.01 * self.rng.random()

    def step(self, n: int = 1) -> None:
        for _ in range(n):
            if self.fail_at is not None and len(self._rows) >= self.fail_at:
                raise RuntimeError("stand-in search failed on purpose")
            if self.step_seconds:
                end = time.perf_counter() + self.step_seconds
                while time.perf_counter() < end:
                    pass
            free = [u for u in self.graph.names if u not in self.pins]
            unit = free[self.rng.integers(len(free))]
            proposal = self.current.with_policy(
                {unit: ("keep", "recompute")[self.rng.integers(2)]})
            cost = self._cost(proposal)
            accepted = bool(self.rng.random() < 0.5)
            if accepted:
                self.current = proposal
                if cost < self._best_cost:
                    self._best_cost, self.best = cost, proposal
                    self.best_result = sim_result(self.graph, proposal)
            self.strategies.append(self.current)
            self._rows.append(dict(iteration=len(self._rows), move="policy", unit=unit,
                                   cost=cost, time=cost, peak=1.0, feasible=True,
                                   accepted=accepted, best_cost=self._best_cost,
                                   elapsed=0.0))

    @property
    def history(self) -> pd.DataFrame:
        return pd.DataFrame(self._rows, columns=["iteration", "move", "unit", "cost", "time",
                                                 "peak", "feasible", "accepted", "best_cost",
                                                 "elapsed"])

    def acceptance_rate(self, window: int = 100) -> float:
        rows = self._rows[-window:]
        return float(np.mean([r["accepted"] for r in rows])) if rows else float("nan")

    def pin(self, units, policy: str = "recompute") -> None:
        units = list(units)
        self.graph.index_of(units)        # unknown units raise, naming the unit
        if policy not in memflow.strategy.POLICIES:
            raise ValueError(f"unknown policy {policy!r}")
        for u in units:
            self.pins[u] = policy
        self.current = self.current.with_policy({u: policy for u in units})

    def unpin(self, units) -> None:
        for u in units:
            self.pins.pop(u, None)
