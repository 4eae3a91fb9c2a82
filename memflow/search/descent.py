"""Descent: the search's best improved one change at a time, every change tried in turn.

The Metropolis chain (:class:`~memflow.search.mcmc.MCMCSearch`) accepts a proposal a few per
cent worse most of the time (``beta``), so it wanders among strategies within a few per cent
of its best and rarely stands on the best long enough to draw the one change that improves
it. On resnet50 at batch 1,024 on 4×V100-16GB a chain of 3,000 proposals ended 1.5% slower
than the strategy one change away from its best (a unit's optimizer back on the device):
about five of its proposals drew that unit's optimizer move. Descent tries each change once:
from the best, every free unit's every other memory policy, shard level and optimizer place,
and the strategy's neighbouring micro-batch counts and other precisions — of the moves the
search draws (a change whose move has weight 0 is not tried); the first that the search's
cost prefers becomes the best (:meth:`MCMCSearch.offer`, pins applied) and descent starts
again from it, until none improves or the time is spent. A parallel configuration is not
among the changes: the chain's config moves draw from a space too large to enumerate (every
degree on every aligned device run, per unit).

>>> import memflow
>>> from memflow.search import MCMCSearch
>>> from memflow.search.synthetic import chain_graph
>>> g = chain_graph(4, batch=64, width=512)
>>> search = MCMCSearch(g, memflow.Cluster.preset("1xV100-16GB"), seed=0,
...                     init=memflow.Strategy.single_device(g).with_policy(offload=["l1"]))
>>> start = search.best_score.time
>>> tried = descend(search)
>>> search.best.policies, bool(search.best_score.time < start), tried > 0
(['keep', 'keep', 'keep', 'keep'], True, True)
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Collection, Iterator

import numpy as np

from ..errors import MemflowError
from ..strategy import Strategy
from ..strategy.runnable import RUNNABLE
from .microbatch_counts import microbatch_choices, with_microbatches
from .space import SearchSpace, policy_label, shard_choices

if TYPE_CHECKING:
    from .mcmc import MCMCSearch

__all__ = ["neighbours", "global_changes", "descend", "search_and_descend", "SETTLE_WITHIN"]

SETTLE_WITHIN = 0.05
"""A global change is settled only where it costs at most this share more than the best: two
micro-batches on resnet50 cost 0.3% more before settling, on llama2-7b 96% more (each
micro-batch gathers FSDP's parameters again), where settling scanned every unit change, round
after round, for the whole 30 s budget and won nothing."""


def _together(space: SearchSpace, i: int) -> list[str]:
    """The units that change model states with unit ``i``: the root group's in the runnable
    space (export shards and places them as one), else ``i`` alone."""
    if space.runnable and space.root_sharded[i]:
        return [space.names[j] for j in np.flatnonzero(space.root_sharded)]
    return [space.names[i]]


def neighbours(s: Strategy, space: SearchSpace, moves: Collection[str]) -> Iterator[Strategy]:
    """Every strategy one change of ``moves`` (move names) from ``s`` that descent tries (free
    units only; in the runnable space only those export runs), global changes first: they are
    few and move the most."""
    return _runnable(global_changes(s, space, moves) + _unit_changes(s, space, moves), s, space)


def _runnable(candidates: list[Strategy], s: Strategy, space: SearchSpace) -> Iterator[Strategy]:
    """The ``candidates`` that change ``s`` and, in the runnable space, that export runs (each
    checked when it is reached: the check is a step's cost)."""
    return (c for c in candidates if c != s and (not space.runnable or space.runs(c)))


def global_changes(s: Strategy, space: SearchSpace, moves: Collection[str]) -> list[Strategy]:
    """``s`` with a neighbouring micro-batch count or another precision (of ``moves``)."""
    candidates: list[Strategy] = []
    if "microbatches" in moves:
        candidates += [with_microbatches(s, m, space) for m in microbatch_choices(s, space)]
    if "precision" in moves and not space.precision_pinned:
        candidates += [s.with_model_states(precision=p) for p in space.precisions(s)]
    return candidates


def _unit_changes(s: Strategy, space: SearchSpace, moves: Collection[str]) -> list[Strategy]:
    candidates: list[Strategy] = []
    for i in space.free():
        i = int(i)
        name, now = space.names[i], policy_label(int(s.policy[i]), float(s.error_bound[i]))
        if "policy" in moves:
            candidates += [s.with_policy({name: lab}) for lab in
                           (policy_label(c, e) for c, e in space.policy_choices(i)) if lab != now]
        group = _together(space, i)
        if space.pinned[[space.position[u] for u in group]].any():
            continue        # a pinned unit of the group never changes
        if "shard" in moves:
            candidates += [s.with_shard(dict.fromkeys(group, lv)) for lv in shard_choices(s, i)]
        if "optimizer_place" in moves and (not space.runnable or RUNNABLE.offload_optimizer):
            host = {u for u, off in zip(s.units, s.offload_optimizer) if off}
            host = host - set(group) if s.offload_optimizer[i] else host | set(group)
            candidates.append(s.with_model_states(offload_optimizer=sorted(host) or False))
    return candidates


def _settle(search: "MCMCSearch", s: Strategy, moves: Collection[str],
            end: float | None) -> tuple[Strategy, int]:
    """``s`` improved by per-unit changes alone, each the first that lowers the search's cost
    (feasibility included), until none does or the time is spent; and the tries."""
    space, score, tried, improved = search.space, search.score(s), 0, True
    while improved:
        improved = False
        for option in _runnable(_unit_changes(s, space, moves), s, space):
            if end is not None and time.perf_counter() >= end:
                return s, tried
            tried += 1
            new = search.score(option)
            if new.cost < score.cost:
                s, score, improved = option, new, True
                break
    return s, tried


def descend(search: "MCMCSearch", seconds: float | None = None) -> int:
    """Improve ``search``'s best one change at a time (:func:`neighbours`) until no change
    improves it or ``seconds`` of wall time are spent; the strategies tried. A global change
    (micro-batches, precision) that does not improve at once, but costs at most
    :data:`SETTLE_WITHIN` more, is settled first (per-unit changes from it, each lowering the
    cost) and offered settled: two micro-batches on resnet50 cost
    more than one while the optimal schedule's recomputation stays, and win once it goes. Each
    improvement moves the chain to it, so a later ``run`` goes on from descent's best."""
    end = None if seconds is None else time.perf_counter() + float(seconds)
    moves = [m for m, w in search.settings["moves"].items() if w > 0]
    tried, improved = 0, True
    while improved:
        improved = False
        best, space = search.best, search.space
        globals_ = global_changes(best, space, moves)
        for option in _runnable(globals_ + _unit_changes(best, space, moves), best, space):
            if end is not None and time.perf_counter() >= end:
                return tried
            tried += 1
            try:
                if search.offer(option):
                    improved = True
                    break
                if option in globals_ and search.score(option).cost <= \
                        search.best_score.cost * (1 + SETTLE_WITHIN):
                    settled, n = _settle(search, option, moves, end)
                    tried += n
                    if settled != option and search.offer(settled):
                        improved = True
                        break
            except MemflowError:
                continue        # a change the graph or cluster refuses: not a neighbour
    return tried


def search_and_descend(search: "MCMCSearch", seconds: float, chunks: int = 3) -> int:
    """Descent from where ``search`` stands, then the chain and descent in turn (the chain in
    ``chunks`` slices of the budget), within ``seconds`` of wall time in all; descent's tries.

    Descent comes first: from the chain's best after a chunk it ended on llama2-7b at the
    seed's 910 ms in one run, from the seed itself at 889 (``benchmarks/bench_quality.py``).

    >>> import memflow
    >>> from memflow.search import MCMCSearch
    >>> from memflow.search.synthetic import chain_graph
    >>> g = chain_graph(4, batch=64, width=512)
    >>> search = MCMCSearch(g, memflow.Cluster.preset("1xV100-16GB"), seed=0)
    >>> search_and_descend(search, seconds=0.5) > 0, search.iteration > 0
    (True, True)
    """
    end = time.perf_counter() + seconds
    tried = descend(search, seconds=seconds)
    while (left := end - time.perf_counter()) > 0:
        search.run(seconds=min(left, seconds / chunks))
        tried += descend(search, seconds=max(0.0, end - time.perf_counter()))
    return tried
