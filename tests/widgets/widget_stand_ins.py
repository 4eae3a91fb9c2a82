"""A stand-in for memflow.MCMCSearch, which has not landed yet; it goes when it does.

It follows issue 4's API (step, history with docs/data-model.md's columns, best, best_result,
current, acceptance_rate, pin, unpin, pins) and uses the real OpGraph, Strategy and simulator.
Its proposals flip one free unit between keep and recompute; it also records the current
strategy after every step, which lets tests check pins in every strategy.
"""
from __future__ import annotations

import time

import numpy as np
import pandas as pd

import memflow

class StandInSearch:
    """Random policy moves with MCMCSearch's interface: step, history, best, pins …"""

    def __init__(self, graph, cluster, devices=("gpu0", "gpu1"), *, seed: int = 0,
                 step_seconds: float = 0.0, fail_at: int | None = None):
        self.graph = graph
        self.cluster = cluster
        self.rng = np.random.default_rng(seed)
        self.step_seconds = step_seconds
        self.fail_at = fail_at
        self.current = memflow.Strategy.data_parallel(graph, list(devices))
        self.best = self.current
        self.pins: dict[str, str] = {}
        self.strategies: list = []            # the current strategy after every step
        self._rows: list[dict] = []
        self._best_cost = np.inf
        self.best_result = memflow.simulate(graph, self.best, cluster)

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
                    self.best_result = memflow.simulate(self.graph, proposal, self.cluster)
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
