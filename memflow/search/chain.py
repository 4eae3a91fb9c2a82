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

from .._jsonio import Fields
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
    def from_dict(cls, doc: Mapping[str, Any], *, source: str = "search document",
                  at: str = "chain") -> "ChainState":
        """Inverse of :meth:`to_dict`; every field type-checked, errors naming ``source`` and
        the field (``chain.current.sample``).

        >>> s = Strategy(["a"], devices=[("gpu0",)])
        >>> doc = ChainState.start(s, Score(1.0, 1.0, np.array([5.0]), True), seed=0,
        ...                        memory_aware=True).to_dict()
        >>> ChainState.from_dict({**doc, "iteration": "x"}, source="s.json")
        Traceback (most recent call last):
        ...
        memflow.errors.FileFormatError: s.json: field 'chain.iteration' must be an integer >= 0, got 'x'
        """
        f = Fields(doc, source, at)
        rng = f.sub("rng")
        name = rng.str("bit_generator")
        kind = getattr(np.random, name, None)
        if not (isinstance(kind, type) and issubclass(kind, np.random.BitGenerator)):
            raise rng.fail("bit_generator", "a numpy bit generator such as 'PCG64'", name)
        bitgen = kind()
        try:
            bitgen.state = rng.doc
        except (TypeError, ValueError, KeyError) as exc:
            raise FileFormatError(f"{source}: field {f.name('rng')!r} is not a {name} "
                                  f"state ({exc})") from None

        def strategy(key: str) -> Strategy:
            return Strategy.from_dict(f.get(key, "a strategy"), source=source, at=f.name(key))

        def score(key: str) -> Score:
            return Score.from_dict(f.get(key, "a score"), source=source, at=f.name(key))

        return cls(strategy("current"), score("current_score"), strategy("best"),
                   score("best_score"), f.bool("seen_feasible"), f.bool("memory_aware"),
                   f.number("reference", positive=True), np.random.Generator(bitgen),
                   f.int("iteration", least=0), f.int("since_restart", least=0),
                   f.number("elapsed", least=0))
