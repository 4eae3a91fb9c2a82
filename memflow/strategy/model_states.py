"""A strategy's model-state choices: per-unit shard level and optimizer placement, global
precision (the vocabulary is :mod:`memflow.strategy.shard_levels`).

Attached to :class:`~memflow.strategy.Strategy` as methods, where users look for them.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from .shard_levels import check_precision, shard_codes
from .strategy import Strategy, _frozen

__all__ = ["with_shard", "with_model_states"]


def with_shard(self: Strategy, levels: Any, units: str | Iterable[str] | None = None) -> Strategy:
    """A copy with the shard level (:data:`~memflow.strategy.shard_levels.SHARD_LEVELS`)
    of ``units`` (default: every unit) set to ``levels``, or with ``levels`` a mapping
    unit -> level. Sharding is over each unit's sample (data-parallel) group.

    >>> s = Strategy(["a", "b"], devices=[("gpu0", "gpu1")] * 2, sample=[2, 2])
    >>> s.with_shard("parameters").with_shard({"b": "optimizer"}).shard_levels
    ['parameters', 'optimizer']
    """
    shard = self.shard.copy()
    if isinstance(levels, Mapping):
        pos, values = self._positions(levels), list(levels.values())
    else:
        pos = (range(len(self)) if units is None
               else self._positions([units] if isinstance(units, str) else units))
        values = [levels] * len(pos)
    shard[list(pos)] = shard_codes([self.units[i] for i in pos], values)
    return self._replace(shard=_frozen(shard))


def with_model_states(self: Strategy, *, precision: str | None = None,
                      offload_optimizer: Any = None) -> Strategy:
    """A copy with the global ``precision`` (one of :data:`PRECISIONS`) and/or the units
    whose optimizer states and step live on the host (``offload_optimizer``: True or
    False for every unit, or a list of units to offload, the others not).

    >>> s = Strategy(["a", "b"], devices=[("gpu0",)] * 2)
    >>> t = s.with_model_states(precision="bf16", offload_optimizer=["b"])
    >>> t.precision, t.offload_optimizer.tolist()
    ('bf16', [False, True])
    """
    fields: dict[str, Any] = {}
    if precision is not None:
        fields["precision"] = check_precision(precision)
    if offload_optimizer is not None:
        off = np.zeros(len(self), bool)
        if isinstance(offload_optimizer, bool):
            off[:] = offload_optimizer
        else:
            off[self._positions([offload_optimizer] if isinstance(offload_optimizer, str)
                                else offload_optimizer)] = True
        fields["offload_optimizer"] = _frozen(off)
    return self._replace(**fields)


Strategy.with_shard = with_shard
Strategy.with_model_states = with_model_states
