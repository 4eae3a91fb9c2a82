"""What a move proposes (:mod:`memflow.search.moves`, :mod:`memflow.search.state_moves`): a
candidate strategy with the move that made it and the unit it changed."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np

from ..strategy import Strategy

if TYPE_CHECKING:
    from .space import SearchSpace

__all__ = ["Proposal", "Move", "pick"]


@dataclass(frozen=True)
class Proposal:
    """A candidate strategy, the move that made it and the unit it changed."""

    move: str
    unit: str
    strategy: Strategy


def pick(rng: np.random.Generator, seq):
    """One element of ``seq``, drawn uniformly by ``rng``."""
    return seq[int(rng.integers(len(seq)))]


Move = Callable[[np.random.Generator, Strategy, "SearchSpace"], "Proposal | None"]
"""A move: ``(rng, strategy, space) -> Proposal | None`` (None: nothing to propose)."""
