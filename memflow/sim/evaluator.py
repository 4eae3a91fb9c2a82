"""The evaluator: a strategy's simulated time and peak memory, judged against a memory limit.

Every planner and the search ask the same three questions of a strategy — how long is a step,
how much does each device hold at its peak, does it fit — and ask them again for strategies
they have seen (a search returns to its current strategy after every rejected move, a planner
revisits candidates). :class:`Evaluator` answers them with one :class:`Outcome` per strategy,
kept in a bounded table, against the limits of :func:`memflow.hardware.limits.memory_limits`.

A strategy *fits* when every device holds its peak within its limit and every host it uses
holds what is offloaded to it within its memory.

>>> import memflow
>>> from memflow.search.synthetic import chain_graph
>>> g = chain_graph(4)
>>> ev = Evaluator(g, memflow.Cluster.preset("2xV100-16GB"), {"gpu0": "60MB"})
>>> out = ev(memflow.Strategy.single_device(g))
>>> out.fits, round(out.over, 2), out.peaks[1]
(False, 0.4, np.float64(0.0))
>>> ev(memflow.Strategy.single_device(g)) is out, ev.simulations
(True, 1)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Generic, Hashable, TypeVar

import numpy as np

from ..hardware.limits import memory_limits
from ..strategy import Strategy
from .simulator import Simulator

__all__ = ["Evaluator", "Outcome", "Memo"]

CACHE_SIZE = 200_000
"""Outcomes kept per evaluator (a long search's worth of revisits, a few hundred MB at most)."""

T = TypeVar("T")


@dataclass(frozen=True)
class Outcome:
    """A strategy's simulated step, judged against the evaluator's limits."""

    strategy: Strategy
    time: float          # simulated iteration time (s)
    peaks: np.ndarray    # bytes per device of the cluster, in its order (0 where unused)
    over: float          # the worst device's excess as a fraction of its limit (0 within)
    fits: bool           # every device within its limit, every host it uses within its memory

    @property
    def peak(self) -> float:
        """Bytes on the most loaded device."""
        return float(self.peaks.max())


class Memo(Generic[T]):
    """Answers kept per strategy, at most ``size`` of them; when full, the older half goes —
    a search that has moved on is least likely to come back to what it saw first (dicts keep
    insertion order)."""

    def __init__(self, size: int = CACHE_SIZE):
        self.size = int(size)
        self._table: dict[Hashable, T] = {}

    def get(self, strategy: Strategy, make: Callable[[Strategy], T]) -> T:
        """The answer for ``strategy``, made by ``make`` the first time."""
        # keyed by the strategy's identity tuple, built once: a Strategy rebuilds it for every
        # hash and for both sides of every comparison, three times per lookup that hits
        key = strategy._key()
        hit = self._table.get(key)
        if hit is None:
            hit = make(strategy)
            if len(self._table) >= self.size:
                for old in list(self._table)[: self.size // 2]:
                    del self._table[old]
            self._table[key] = hit
        return hit


class Evaluator:
    """Judges strategies of ``graph`` on ``cluster`` against ``limit`` (any form
    :func:`~memflow.hardware.limits.memory_limits` reads; default each device's capacity),
    remembering each answer. ``optimizer`` and ``precision`` are the simulator's.
    """

    def __init__(self, graph, cluster, limit: Any = None, *, optimizer: str = "sgd",
                 precision: str | None = None, cache_size: int = CACHE_SIZE):
        self._setup(Simulator(graph, cluster, optimizer=optimizer, precision=precision), limit,
                    cache_size)

    @classmethod
    def of(cls, simulator: Simulator, limit: Any = None, *,
           cache_size: int = CACHE_SIZE) -> "Evaluator":
        """An evaluator on an existing simulator (sharing its caches)."""
        self = cls.__new__(cls)
        self._setup(simulator, limit, cache_size)
        return self

    def _setup(self, simulator: Simulator, limit: Any, cache_size: int) -> None:
        self.simulator = simulator
        self.graph, self.cluster = simulator.graph, simulator.cluster
        self.limits = memory_limits(self.cluster, limit)
        self.simulations = 0
        self._memo: Memo[Outcome] = Memo(cache_size)
        self._host_sets: dict[bytes, tuple[np.ndarray, np.ndarray]] = {}

    def over(self, peaks: np.ndarray) -> float:
        """The worst device's bytes over its limit, as a fraction of that limit (0 within)."""
        # np.max's reduction without its Python wrappers (a search asks once per simulation)
        return float(np.maximum.reduce((peaks - self.limits) / self.limits, initial=0.0))

    def _hosts(self, devices_used: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The hosts of the devices at ``devices_used`` and their memory, found once per set
        of devices (np.unique was a third of judging a simulated strategy)."""
        key = devices_used.tobytes()
        hit = self._host_sets.get(key)
        if hit is None:
            ca = self.cluster.arrays
            hosts = np.unique(ca.host[devices_used])
            hit = self._host_sets[key] = (hosts, ca.host_memory[hosts])
        return hit

    def judge(self, strategy: Strategy) -> Outcome:
        """Simulate ``strategy`` and judge it (no memory of earlier answers)."""
        run = self.simulator.run(strategy)
        self.simulations += 1
        peaks = np.asarray(run.device.peak[run.device_class], np.float64)
        hosts, memory = self._hosts(run.devices_used)
        over = self.over(peaks)
        fits = over <= 0.0 and bool((run.host.peak[hosts] <= memory).all())
        return Outcome(strategy, run.iteration_time, peaks, over, fits)

    def __call__(self, strategy: Strategy) -> Outcome:
        """The outcome of ``strategy``, simulated the first time it is asked for."""
        return self._memo.get(strategy, self.judge)
