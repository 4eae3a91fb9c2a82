"""The search's cost: simulated iteration time plus a memory term, memoized per strategy.

A strategy whose peak exceeds a device's limit (its capacity, or ``memory_limit`` when lower)
costs ``time · (1 + jump + weight · over)`` where ``over`` is the worst device's excess as a
fraction of its limit. The term is continuous in the excess, so the Markov chain can walk
through a slightly infeasible strategy on its way between feasible ones, and the jump makes
every infeasible strategy cost more than the same strategy would if it fitted. Whether a
strategy can be *reported* as best is the chain's business (:mod:`memflow.search.chain`): only
feasible ones, once one has been seen.

With ``memory_aware=False`` the cost is the time alone — FlexFlow's memory-oblivious search,
kept for comparison.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from ..errors import SearchError
from ..hardware import parse_bytes
from ..sim import Simulator
from ..strategy import Strategy

__all__ = ["Score", "CostModel", "memory_limits"]

JUMP = 0.05
"""Fraction of the time added to every infeasible strategy."""
WEIGHT = 4.0
"""Fraction of the time added per unit of relative excess (4 → 10% over costs +40%)."""


@dataclass(frozen=True)
class Score:
    """What the chain keeps of one simulation: cost, time, peak per device, feasible."""

    cost: float
    time: float
    peak: np.ndarray
    feasible: bool

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return {"cost": self.cost, "time": self.time, "peak": self.peak.tolist(),
                "feasible": self.feasible}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> "Score":
        """Inverse of :meth:`to_dict`."""
        return cls(float(doc["cost"]), float(doc["time"]), np.asarray(doc["peak"], np.float64),
                   bool(doc["feasible"]))


def memory_limits(cluster, memory_limit: Any = None) -> np.ndarray:
    """Bytes allowed per device, in cluster order: the capacity, capped by ``memory_limit``.

    ``memory_limit`` is a size (bytes or a string such as ``"8GB"``) for every device, or a
    mapping device → size for some.

    >>> import memflow
    >>> c = memflow.Cluster.preset("4xV100-16GB")
    >>> (memory_limits(c, "8GiB") / 2**30).tolist()
    [8.0, 8.0, 8.0, 8.0]
    >>> memory_limits(c, {"gpu9": 1})
    Traceback (most recent call last):
    ...
    memflow.errors.SearchError: memory_limit names device 'gpu9', which is not in the cluster; devices: ['gpu0', 'gpu1', 'gpu2', 'gpu3']
    """
    names = [str(d) for d in cluster.devices.index]
    cap = cluster.arrays.memory.astype(np.float64).copy()
    if memory_limit is None:
        return cap
    if isinstance(memory_limit, Mapping):
        out = cap.copy()
        for dev, value in memory_limit.items():
            if dev not in names:
                raise SearchError(f"memory_limit names device {dev!r}, which is not in the "
                                  f"cluster; devices: {names[:8]}")
            out[names.index(dev)] = min(cap[names.index(dev)], _positive(value))
        return out
    return np.minimum(cap, _positive(memory_limit))


def _positive(value: Any) -> float:
    v = parse_bytes(value)
    if not v > 0:
        raise SearchError(f"memory_limit must be a positive size, got {value!r}")
    return v


class CostModel:
    """Scores strategies with a :class:`~memflow.sim.Simulator`, remembering each one.

    A Markov chain revisits the same strategies often (every rejected move returns to one), so
    scores are kept in a bounded table keyed by the strategy: a revisit costs a hash lookup.

    >>> import memflow
    >>> from memflow.search.synthetic import chain_graph
    >>> g = chain_graph(4)
    >>> sim = memflow.sim.Simulator(g, memflow.Cluster.preset("1xV100-16GB"))
    >>> cm = CostModel(sim, memory_limit=1e6)
    >>> s = cm(memflow.Strategy.single_device(g))
    >>> s.feasible, s.cost > s.time
    (False, True)
    """

    def __init__(self, simulator: Simulator, *, memory_limit: Any = None,
                 memory_aware: bool = True, jump: float = JUMP, weight: float = WEIGHT,
                 cache_size: int = 200_000):
        self.simulator = simulator
        self.limit = memory_limits(simulator.cluster, memory_limit)
        self.memory_aware = bool(memory_aware)
        self.jump, self.weight = float(jump), float(weight)
        self.cache_size = int(cache_size)
        self._memo: dict[tuple, Score] = {}
        self.simulations = 0

    def score(self, time: float, peak: np.ndarray) -> Score:
        """The score of a simulated ``time`` and ``peak`` (bytes per device)."""
        over = float(np.max((peak - self.limit) / self.limit, initial=0.0))
        feasible = over <= 0.0
        cost = time
        if self.memory_aware and not feasible:
            cost = time * (1.0 + self.jump + self.weight * over)
        return Score(float(cost), float(time), peak, feasible)

    def __call__(self, strategy: Strategy) -> Score:
        # keyed by the strategy's identity tuple, built once: a Strategy rebuilds it for every
        # hash and for both sides of every comparison, three times per lookup that hits
        key = strategy._key()
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        ev = self.simulator.evaluate(strategy)
        self.simulations += 1
        out = self.score(ev.iteration_time, np.asarray(ev.peak, np.float64))
        if len(self._memo) >= self.cache_size:
            # drop the oldest half: dicts keep insertion order, and old entries are the
            # least likely to be revisited by a chain that has moved on
            for old in list(self._memo)[: self.cache_size // 2]:
                del self._memo[old]
        self._memo[key] = out
        return out
