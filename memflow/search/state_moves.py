"""Moves over model states: a unit's shard level (ZeRO-1/2/3), the global precision, a unit's
optimizer on the device or the host (ZeRO-Offload). The search holds those whose choices export
runs (:data:`EXPORTED_MODEL_STATE_MOVES`); :mod:`memflow.search.moves` wraps them in the guards
that keep their proposals runnable (:mod:`memflow.search.move_guards`)."""
from __future__ import annotations

import numpy as np

from ..strategy import Strategy
from ..strategy.runnable import RUNNABLE
from .proposal import Proposal, pick
from .space import SearchSpace, shard_choices

__all__ = ["shard", "precision", "optimizer_place", "SHARD_CHECKS", "MODEL_STATE_MOVES",
           "MODEL_STATE_WEIGHTS", "EXPORTED_MODEL_STATE_MOVES"]

MODEL_STATE_MOVES = ("shard", "precision", "optimizer_place")
"""Moves over model states. Search space = export space: the default weights hold those whose
choices export runs (:data:`EXPORTED_MODEL_STATE_MOVES`: all three, as FSDP2 / ZeRO-1,
bf16 / pure-bf16 / amp (on whole-model replicas) and optimizer offload)."""
MODEL_STATE_WEIGHTS = {"shard": 0.1, "precision": 0.05, "optimizer_place": 0.05}
EXPORTED_MODEL_STATE_MOVES = tuple(m for m, exported in (
    ("shard", len(RUNNABLE.shard_levels) > 1), ("precision", len(RUNNABLE.precisions) > 1),
    ("optimizer_place", RUNNABLE.offload_optimizer)) if exported)
"""The model-state moves whose choices :data:`~memflow.strategy.runnable.RUNNABLE` accepts."""


SHARD_CHECKS = 4
"""Options the shard move checks against export's rules before it proposes nothing."""


def shard(rng: np.random.Generator, s: Strategy, space: SearchSpace) -> Proposal | None:
    """One free unit with data-parallel replicas gets another shard level (ZeRO-1/2/3). In
    the runnable space, the units export shards in the model's root group
    (:func:`~memflow.strategy.runnable.root_sharded`) move together, and only to levels
    export runs; nothing when the first :data:`SHARD_CHECKS` options drawn do not run.

    >>> import memflow
    >>> from memflow.search.synthetic import chain_graph
    >>> g = chain_graph(2, batch=8)
    >>> sp = SearchSpace(g, memflow.Cluster.preset("4xV100-16GB"), runnable=False)
    >>> shard(np.random.default_rng(0), memflow.Strategy.data_parallel(g, 4), sp).strategy.shard_levels
    ['none', 'gradients']
    """
    root = np.flatnonzero(space.root_sharded).tolist()
    movable = ~space.pinned         # a pinned unit of the root group keeps the group's level
    if space.pinned[root].any():
        movable &= ~space.root_sharded
    units = np.flatnonzero(movable).tolist()
    # levels export never writes are left out before the full check (it is no cheaper for
    # being doomed)
    runs = RUNNABLE.shard_levels if space.runnable else None
    # a unit, then a level of it, drawn and checked one at a time (a uniform pick among the
    # options that run, as drawing without replacement gives), at most SHARD_CHECKS full
    # checks: checking every option was most of a step where none runs (tensor splits inside
    # pipeline stages: 78 options on a 26-unit Llama, 48 ms per move)
    checks = 0
    while units and checks < SHARD_CHECKS:
        i = units.pop(int(rng.integers(len(units))))
        together, levels = (root if space.root_sharded[i] else [i]), shard_choices(s, i)
        if runs is not None:
            levels = [lv for lv in levels if lv in runs]
        names = [space.names[j] for j in together]
        while levels and checks < SHARD_CHECKS:
            option = s.with_shard(dict.fromkeys(names, levels.pop(int(rng.integers(len(levels))))))
            checks += 1
            if not space.runnable or space.runs(option):
                return Proposal("shard", space.names[i], option)
    return None


def precision(rng: np.random.Generator, s: Strategy, space: SearchSpace) -> Proposal | None:
    """The whole strategy gets another precision (global: ``unit`` is empty); bf16 ones only
    where a device has bf16 units (:meth:`~memflow.search.space.SearchSpace.precisions`), ``amp``
    in the runnable space only on a graph holding its program (:attr:`SearchSpace.amp`).

    >>> import memflow
    >>> from memflow.search.synthetic import chain_graph
    >>> g = chain_graph(2)
    >>> def draw(gpu):
    ...     sp = SearchSpace(g, memflow.Cluster.preset(gpu), runnable=False)
    ...     s = precision(np.random.default_rng(0), memflow.Strategy.single_device(g), sp)
    ...     return s.strategy.precision
    >>> draw("1xA100-80GB"), draw("1xV100-16GB")
    ('pure-bf16', 'amp')
    """
    choices = space.precisions(s)
    if not choices or space.precision_pinned:
        return None
    return Proposal("precision", "", s.with_model_states(precision=pick(rng, choices)))


def optimizer_place(rng: np.random.Generator, s: Strategy,
                    space: SearchSpace) -> Proposal | None:
    """One free unit's optimizer states and step move to the host (ZeRO-Offload) or back.

    >>> import memflow
    >>> from memflow.search.synthetic import chain_graph
    >>> g = chain_graph(2)
    >>> sp = SearchSpace(g, memflow.Cluster.preset("1xV100-16GB"), runnable=False)
    >>> p = optimizer_place(np.random.default_rng(0), memflow.Strategy.single_device(g), sp)
    >>> p.unit, p.strategy.offload_optimizer.tolist()
    ('l1', [False, True])
    """
    free = space.free()
    if not len(free) or (space.runnable and not RUNNABLE.offload_optimizer):
        return None
    i = int(pick(rng, free))
    off = s.offload_optimizer.copy()
    root = np.flatnonzero(space.root_sharded)
    # in the runnable space the root fully_shard group's units move together (one policy)
    together = root if space.runnable and space.root_sharded[i] and \
        not space.pinned[root].any() else [i]
    off[together] = not off[i]
    units = [space.names[k] for k in np.flatnonzero(off)]
    return Proposal("optimizer_place", space.names[i], s.with_model_states(
        offload_optimizer=units if units else False))
