"""The state of one Markov chain: where it is, the best it has seen, and its random stream.

Everything the next proposal depends on lives here, so saving it (with the search's settings)
and loading it back continues the chain exactly: the numpy ``Generator``'s bit-generator state
is stored, not the seed.

Which strategy may be reported as best: under the memory-aware cost only a feasible one, once
any feasible strategy has been seen (until then the least-cost strategy stands in, and
:attr:`ChainState.best_cost` is infinite, so the best cost never increases); under the
memory-oblivious cost, the least cost, feasible or not — as FlexFlow would report it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from ..errors import FileFormatError
from ..strategy import Strategy
from .cost import Score

__all__ = ["ChainState"]


@dataclass
class ChainState:
    """Current and best strategies with their scores, counters and the random generator.

    >>> import numpy as np
    >>> from memflow.strategy import Strategy
    >>> s = Strategy(["a"], devices=[("gpu0",)])
    >>> bad, good = Score(1.2, 1.0, np.array([9.0]), False), Score(1.1, 1.1, np.array([5.0]), True)
    >>> c = ChainState.start(s, bad, seed=0, memory_aware=True)
    >>> c.best_cost
    inf
    >>> c.offer(s.with_policy(recompute=["a"]), good), c.best_cost
    (True, 1.1)
    """

    current: Strategy
    current_score: Score
    best: Strategy
    best_score: Score
    seen_feasible: bool
    memory_aware: bool
    reference: float          # time of the initial strategy: the scale of cost differences
    rng: np.random.Generator
    iteration: int = 0
    since_restart: int = 0
    elapsed: float = 0.0

    @classmethod
    def start(cls, strategy: Strategy, score: Score, *, seed: int,
              memory_aware: bool) -> "ChainState":
        """A chain standing on ``strategy``."""
        return cls(strategy, score, strategy, score, bool(score.feasible), memory_aware,
                   score.time if score.time > 0 else 1.0, np.random.default_rng(seed))

    @property
    def best_cost(self) -> float:
        """Cost of the reportable best (infinite while none is feasible, memory-aware)."""
        if self.memory_aware and not self.seen_feasible:
            return float("inf")
        return self.best_score.cost

    def offer(self, strategy: Strategy, score: Score) -> bool:
        """Make ``strategy`` the best if it beats it under the rules above; whether it did."""
        better = score.cost < self.best_score.cost
        if self.memory_aware:
            if score.feasible:
                take = better or not self.seen_feasible
                self.seen_feasible = True
            else:
                take = better and not self.seen_feasible
        else:
            take = better
        if take:
            self.best, self.best_score = strategy, score
        return take

    def move_to(self, strategy: Strategy, score: Score) -> None:
        """Make ``strategy`` the current state."""
        self.current, self.current_score = strategy, score

    def reset_best(self, strategy: Strategy, score: Score) -> None:
        """Replace the best outright (after a pin changed what the best may be)."""
        self.best, self.best_score = strategy, score
        self.seen_feasible = bool(score.feasible)

    # ------------------------------------------------------------------ persistence
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready state, random generator included."""
        return {"current": self.current.to_dict(), "current_score": self.current_score.to_dict(),
                "best": self.best.to_dict(), "best_score": self.best_score.to_dict(),
                "seen_feasible": self.seen_feasible, "memory_aware": self.memory_aware,
                "reference": self.reference, "rng": self.rng.bit_generator.state,
                "iteration": self.iteration, "since_restart": self.since_restart,
                "elapsed": self.elapsed}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> "ChainState":
        """Inverse of :meth:`to_dict`."""
        try:
            state = doc["rng"]
            bitgen = getattr(np.random, state["bit_generator"])()
            bitgen.state = state
            return cls(Strategy.from_dict(doc["current"]), Score.from_dict(doc["current_score"]),
                       Strategy.from_dict(doc["best"]), Score.from_dict(doc["best_score"]),
                       bool(doc["seen_feasible"]), bool(doc["memory_aware"]),
                       float(doc["reference"]), np.random.Generator(bitgen),
                       int(doc["iteration"]), int(doc["since_restart"]), float(doc["elapsed"]))
        except KeyError as exc:
            raise FileFormatError(f"search chain state lacks the field {exc}") from None
        except (AttributeError, TypeError, ValueError) as exc:
            raise FileFormatError(f"search chain state is unreadable ({exc})") from None
