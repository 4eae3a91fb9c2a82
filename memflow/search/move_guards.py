"""What keeps a move's proposal in the runnable space (:mod:`memflow.search.moves`): wrappers
that, in the runnable space only, propose nothing, or the proposal adjusted, where export
would not run what the move made (:mod:`memflow.strategy.runnable`). A move is a function
``(rng, strategy, space) -> Proposal | None``.
"""
from __future__ import annotations

import functools
from dataclasses import replace
from typing import TYPE_CHECKING

from ..strategy.runnable import (RUNNABLE, amp_problem, parallel_kinds, pipeline_problem,
                                 sample_problem, sequence_problem)
from .proposal import Move
from .space import SearchSpace, without_sequence

if TYPE_CHECKING:
    import numpy as np

    from ..strategy import Strategy

__all__ = ["keeping_pipeline", "keeping_states", "dropping_states", "dropping_sequence",
           "replicating"]



def keeping_pipeline(move: Move) -> Move:
    """``move`` proposing nothing where, in the runnable space, it would leave a 1F1B pipeline
    export cannot run (:func:`~memflow.strategy.runnable.pipeline_problem`: a device shared
    by two stages, a split inside a stage, a boundary inside a module's own code), or
    per-unit sample degrees it cannot (:func:`~memflow.strategy.runnable.sample_problem`: a
    parameter split or shard level beside them, a group boundary inside a module's code)."""
    @functools.wraps(move)
    def kept(rng: np.random.Generator, s: Strategy, space: SearchSpace) -> object:
        prop = move(rng, s, space)
        if prop is None or not space.runnable:
            return prop
        new = prop.strategy
        stages, _, mixed = parallel_kinds(new)      # no stage above 0: no pipeline problem
        if (stages and pipeline_problem(new, space.graph) is not None) or (
                mixed and sample_problem(new, space.graph) is not None):
            return None
        return prop
    return kept


def keeping_states(move: Move) -> Move:
    """``move`` proposing nothing where, in the runnable space, export could not hold the
    model states at the strategy's precision and optimizer place
    (:meth:`~memflow.search.space.SearchSpace.holds_states`: ZeRO-1 over master or host
    copies, precision or offload with parameter splits or stages, the root group's place)."""
    @functools.wraps(move)
    def kept(rng: np.random.Generator, s: Strategy, space: SearchSpace) -> object:
        prop = move(rng, s, space)
        if prop is not None and space.runnable and not space.holds_states(prop.strategy):
            return None
        return prop
    return kept


def dropping_states(move: Move) -> Move:
    """``move`` (a parallel one) whose proposal, where in the runnable space export could
    not hold its model states (a parameter split or stage under bf16 or optimizer offload),
    trains at the model's own precision with every optimizer on the device instead: a split
    stays reachable from a bf16 strategy, as :meth:`~memflow.search.space.SearchSpace.project`
    would place it."""
    @functools.wraps(move)
    def dropped(rng: np.random.Generator, s: Strategy, space: SearchSpace) -> object:
        prop = move(rng, s, space)
        if prop is not None and space.runnable and not space.holds_states(prop.strategy):
            plain = prop.strategy.with_model_states(offload_optimizer=False)._replace(
                precision=RUNNABLE.precisions[0])
            return replace(prop, strategy=plain) if space.holds_states(plain) else None
        return prop
    return dropped


def replicating(move: Move) -> Move:
    """``move`` (the precision move) whose proposal, where in the runnable space its precision
    runs only on whole-model replicas (``amp``:
    :func:`~memflow.strategy.runnable.amp_problem`) but the strategy has pipeline stages,
    parameter splits or per-unit sample degrees, runs as whole-model replicas over its
    devices instead (:meth:`~memflow.search.space.SearchSpace.whole_replicas`); nothing where
    export would not run that either. The reverse of :func:`dropping_states`: from a pipeline
    plan, autocast data parallelism is reached in one step, where single moves would have to
    pass through strategies export refuses (amp with stages) or that are slower (the
    pipeline undone at fp32) — the gnmt hybrid plan on 8 V100s simulates 0.5695 s a step,
    data parallelism over its devices 0.4555 s, and in amp 0.0807 s."""
    @functools.wraps(move)
    def replicated(rng: np.random.Generator, s: Strategy, space: SearchSpace) -> object:
        prop = move(rng, s, space)
        if prop is None or not space.runnable or amp_problem(prop.strategy) is None:
            return prop
        whole = space.on_exported_schedule(space.whole_replicas(prop.strategy))
        return replace(prop, strategy=whole) if space.runs(whole) else None
    return replicated


def dropping_sequence(move: Move) -> Move:
    """``move`` whose proposal, where in the runnable space it leaves sequence parallelism
    export does not run (:func:`~memflow.strategy.runnable.sequence_problem`: a split block
    off the tensor-parallel group, offloaded, compressed or recomputed), has none instead;
    nothing where that is the strategy it started from."""
    @functools.wraps(move)
    def dropped(rng: np.random.Generator, s: Strategy, space: SearchSpace) -> object:
        prop = move(rng, s, space)
        if prop is None or not space.runnable or not prop.strategy.sequence_parallel.any() \
                or sequence_problem(prop.strategy, space.graph) is None:
            return prop
        plain = without_sequence(prop.strategy)
        return None if plain == s else replace(prop, strategy=plain)
    return dropped
