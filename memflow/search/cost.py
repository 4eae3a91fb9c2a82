"""The search's cost: simulated iteration time plus a memory term, memoized per strategy.

Time, peaks and whether a strategy fits are the :class:`~memflow.sim.evaluator.Evaluator`'s
answers, against the limits every planner uses (:mod:`memflow.hardware.limits`). A strategy
that does not fit costs ``time · (1 + jump + weight · over)`` where ``over`` is the worst
device's excess as a fraction of its limit. The term is continuous in the excess, so the
Markov chain can walk through a slightly infeasible strategy on its way between feasible ones,
and the jump makes every infeasible strategy cost more than the same strategy would if it
fitted (a strategy whose devices fit but whose offloads overflow a host pays the jump alone).
Whether a strategy can be *reported* as best is the chain's business
(:mod:`memflow.search.chain`): only feasible ones, once one has been seen.

With ``memory_aware=False`` the cost is the time alone — FlexFlow's memory-oblivious search,
kept for comparison.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from .._jsonio import Fields
from ..sim import Simulator
from ..sim.evaluator import CACHE_SIZE, Evaluator, Memo
from ..strategy import Strategy

__all__ = ["Score", "CostModel"]

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
    def from_dict(cls, doc: Mapping[str, Any], *, source: str = "score document",
                  at: str = "") -> "Score":
        """Inverse of :meth:`to_dict`; errors name ``source`` and the field."""
        f = Fields(doc, source, at)
        return cls(f.number("cost", least=0), f.number("time", least=0),
                   np.asarray(f.numbers("peak"), np.float64), f.bool("feasible"))


class CostModel:
    """Scores strategies with an :class:`~memflow.sim.evaluator.Evaluator` on ``simulator``,
    remembering each one.

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
                 cache_size: int = CACHE_SIZE):
        self.simulator = simulator
        self.evaluator = Evaluator.of(simulator, memory_limit)
        self.memory_aware = bool(memory_aware)
        self.jump, self.weight = float(jump), float(weight)
        # the scores are what the chain revisits, so they (not the outcomes) are remembered
        self._memo: Memo[Score] = Memo(cache_size)

    @property
    def simulations(self) -> int:
        """Strategies simulated (those answered from memory are not counted)."""
        return self.evaluator.simulations

    def score(self, time: float, peak: np.ndarray, fits: bool | None = None) -> Score:
        """The score of a simulated ``time`` and ``peak`` (bytes per device); ``fits`` as the
        evaluator judged it (default: every device within its limit)."""
        return self._scored(time, peak, self.evaluator.over(peak), fits)

    def _scored(self, time: float, peak: np.ndarray, over: float,
                fits: bool | None) -> Score:
        feasible = over <= 0.0 if fits is None else fits
        cost = time
        if self.memory_aware and not feasible:
            cost = time * (1.0 + self.jump + self.weight * over)
        return Score(float(cost), float(time), peak, bool(feasible))

    def _simulate(self, strategy: Strategy) -> Score:
        out = self.evaluator.judge(strategy)
        return self._scored(out.time, out.peaks, out.over, out.fits)   # its over, not again

    def __call__(self, strategy: Strategy) -> Score:
        return self._memo.get(strategy, self._simulate)
