"""Proposals: each move changes one thing about a strategy, never a pinned unit.

* ``policy`` — one unit gets another memory policy (keep, recompute, offload, selective,
  compress:eb);
* ``segment`` — a recompute segment grows, shrinks or shifts by one unit at one end;
* ``per_op`` — a run of units takes the keep/selective choices of the per-operation planner
  (:func:`~memflow.planners.selective.selective_plan`) at a budget near what the run holds;
* ``config`` — one unit gets another parallel configuration (degrees and devices);
* ``copy`` — one unit takes its neighbour's parallel configuration (FlexFlow's way of growing
  a region of identically placed units, which removes the transfers between them);
* ``swap`` — one part of one unit moves to another device (or two parts trade devices);
* ``replicas`` — every unit gets another data-parallel degree together (whole-model replicas,
  as export runs them), each keeping its parameter split where it still fits;
* ``sequence`` — one split unit that may be sequence parallel (in the runnable space a block
  Megatron splits, on the tensor-parallel path: :mod:`memflow.strategy.sequence_parallel`)
  turns sequence parallelism on or off;
* ``microbatches`` — the strategy gets another number of micro-batches per replica (gradient
  accumulation with one stage, the pipeline's count with several:
  :mod:`memflow.search.microbatch_counts`); opt-in (:data:`MICROBATCH_WEIGHTS`);
* ``shard``, ``precision``, ``optimizer_place`` — a unit's shard level, the global precision,
  a unit's optimizer on the device or the host (:mod:`memflow.search.state_moves`, on by
  default where export writes their choices: FSDP2 / ZeRO-1, bf16 and pure-bf16, amp,
  optimizer offload).

In the runnable space (the default, :mod:`memflow.strategy.runnable`) ``config`` and ``copy``
keep the strategy's one sample degree and split parameters only of units export can slice,
so every proposal from a runnable strategy is runnable; a move that would leave sequence
parallelism where export does not run it (a split block moved off the tensor-parallel group,
offloaded or recomputed) proposes the strategy without it.

A move returns ``None`` when it has nothing to propose (no segment to grow, one device only);
the chain then draws another move. Proposals always differ from the strategy they start from
and are valid by construction, so the inner loop never validates.
"""
from __future__ import annotations

import numpy as np

from ..strategy import POLICIES, Strategy
from ..strategy.runnable import RUNNABLE
from .microbatch_counts import microbatch_choices, with_microbatches
from .move_guards import (dropping_sequence, dropping_states, keeping_pipeline, keeping_states,
                          replicating)
from .per_op import per_op_choices
from .proposal import Move, Proposal, pick
from .space import SearchSpace, policy_label
from .state_moves import (EXPORTED_MODEL_STATE_MOVES, MODEL_STATE_MOVES, MODEL_STATE_WEIGHTS,
                          optimizer_place, precision, shard)

__all__ = ["Proposal", "MOVES", "MEMORY_MOVES", "PARALLEL_MOVES", "DEFAULT_WEIGHTS",
           "FLEXFLOW_WEIGHTS", "policy", "segment", "per_op", "config", "copy", "swap",
           "replicas",
           "MODEL_STATE_MOVES", "MODEL_STATE_WEIGHTS", "EXPORTED_MODEL_STATE_MOVES",
           "MICROBATCH_WEIGHTS",
           "GLOBAL_MOVES", "shard", "precision", "optimizer_place", "sequence", "microbatches"]


def policy(rng: np.random.Generator, s: Strategy, space: SearchSpace) -> Proposal | None:
    """One free unit gets another of its allowed memory policies.

    >>> import memflow
    >>> from memflow.search.synthetic import chain_graph
    >>> g = chain_graph(3)
    >>> sp = SearchSpace(g, memflow.Cluster.preset("1xV100-16GB"))
    >>> p = policy(np.random.default_rng(0), memflow.Strategy.single_device(g), sp)
    >>> p.move, p.unit, p.strategy.policies
    ('policy', 'l2', ['keep', 'keep', 'offload'])
    """
    free = space.free()
    if not len(free):
        return None
    i = int(pick(rng, free))
    now = policy_label(int(s.policy[i]), float(s.error_bound[i]))
    choices = [lab for lab in (policy_label(c, e) for c, e in space.policy_choices(i))
               if lab != now]
    if not choices:
        return None
    name = space.names[i]
    return Proposal("policy", name, s.with_policy({name: pick(rng, choices)}))


NEW_SEGMENT_MAX = 4     # units in a segment made in one move


def segment(rng: np.random.Generator, s: Strategy, space: SearchSpace) -> Proposal | None:
    """A recompute segment grows, shrinks or shifts by one unit at one of its ends, is
    dropped whole, or a new one of 1–4 units appears at a random place; units join with the
    space's recompute policy and leave kept, so nothing when the space allows no recompute
    (and no leaving when it allows no keep).

    The last two are the long jumps: moving a segment elsewhere one unit at a time crosses
    strategies that hold too much or recompute too much, which a cold chain rarely does.

    >>> import memflow
    >>> from memflow.search.synthetic import chain_graph
    >>> g = chain_graph(5)
    >>> sp = SearchSpace(g, memflow.Cluster.preset("1xV100-16GB"))
    >>> s = memflow.Strategy.single_device(g).with_policy(recompute=["l1", "l2"])
    >>> p = segment(np.random.default_rng(1), s, sp)
    >>> p.unit, p.strategy.policies
    ('l3', ['keep', 'keep', 'recompute', 'recompute', 'keep'])
    """
    if space.recompute is None:
        return None         # the space has no recompute policy: no segment to make
    rec, keep = space.recompute, space.keep
    layout, stage = s.layout_ids, s.stage
    # units that may not leave a segment: pinned ones, and all where keep is not allowed
    fixed = space.pinned if keep is not None else np.ones(space.n, bool)
    seg = s.segment     # the chain's strategy was simulated: its segments are known
    recomputes = seg >= 0       # Strategy.segment: -1 on units that do not recompute

    def can_join(j: int, end: int) -> bool:
        return (0 <= j < space.n and not space.pinned[j] and bool(space.may_recompute[j])
                and not recomputes[j] and layout[j] == layout[end]
                and stage[j] == stage[end])

    ops: list[dict[int, int]] = []
    count = int(seg.max()) + 1      # segment ids number the segments from 0 (Strategy.segment)
    if count:
        members = np.flatnonzero(seg == int(pick(rng, range(count))))
        lo, hi = int(members[0]), int(members[-1])
        if can_join(lo - 1, lo):
            ops.append({lo - 1: rec})                             # grow left
            if not fixed[hi]:
                ops.append({lo - 1: rec, hi: keep})                # shift left
        if can_join(hi + 1, hi):
            ops.append({hi + 1: rec})                             # grow right
            if not fixed[lo]:
                ops.append({hi + 1: rec, lo: keep})                # shift right
        if not fixed[lo]:
            ops.append({lo: keep})                                # shrink left
        if hi != lo and not fixed[hi]:
            ops.append({hi: keep})                                # shrink right
        if hi != lo and not fixed[members].any():
            ops.append({int(j): keep for j in members})           # drop
    start = int(rng.integers(space.n))
    if can_join(start, start):                                    # new
        run = [start]
        for j in range(start + 1, min(space.n, start + int(rng.integers(NEW_SEGMENT_MAX)) + 1)):
            if not can_join(j, start):
                break
            run.append(j)
        ops.append({j: rec for j in run})
    if not ops:
        return None
    op = pick(rng, ops)
    changed = {space.names[j]: POLICIES[c] for j, c in op.items()}
    return Proposal("segment", next(iter(changed)), s.with_policy(changed))


def per_op(rng: np.random.Generator, s: Strategy, space: SearchSpace) -> Proposal | None:
    """A run of free units takes the per-operation planner's keep/selective choices at a
    budget near what the run holds now (:func:`~memflow.search.per_op.per_op_choices`).

    >>> import memflow, torch
    >>> from torch import nn
    >>> block = lambda: nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.LayerNorm(64))
    >>> g = memflow.from_torch(nn.Sequential(block(), block()), torch.randn(8, 64))
    >>> sp = SearchSpace(g, memflow.Cluster.preset("1xV100-16GB"))
    >>> p = per_op(np.random.default_rng(3), memflow.Strategy.single_device(g), sp)
    >>> p.unit, p.strategy.policies     # GELU, LayerNorm, Linear: selective; 1.1, 1.2 kept
    ('0.1', ['keep', 'selective', 'selective', 'selective', 'keep', 'keep'])
    """
    changed = per_op_choices(rng, s, space)
    return None if changed is None else Proposal("per_op", next(iter(changed)),
                                                 s.with_policy(changed))


def _config_of(s: Strategy, i: int) -> tuple:
    return (int(s.sample[i]), int(s.parameter[i]), int(s.attribute[i]), s.devices[i])


def config(rng: np.random.Generator, s: Strategy, space: SearchSpace) -> Proposal | None:
    """One free unit gets random degrees and an aligned run of devices for its parts (in
    the runnable space, its sample degree stays: :func:`replicas` changes it for all units).

    >>> import memflow
    >>> from memflow.search.synthetic import chain_graph
    >>> g = chain_graph(3, batch=8)
    >>> sp = SearchSpace(g, memflow.Cluster.preset("4xV100-16GB"), runnable=False)
    >>> p = config(np.random.default_rng(0), memflow.Strategy.single_device(g), sp)
    >>> p.unit, p.strategy.devices[2], int(p.strategy.parameter[2])
    ('l2', ('gpu0', 'gpu1', 'gpu2', 'gpu3'), 4)
    """
    free = space.free()
    if not len(free) or len(space.devices) < 2:
        return None
    i = int(pick(rng, free))
    options = space.degrees(i, s.microbatches,
                            sample=int(s.sample[i]) if space.runnable else None)
    for _ in range(4):      # a few draws; the space is rarely so small that all repeat
        sp, pp, ap = pick(rng, options)
        devs = pick(rng, space.groups(sp * pp * ap))
        if (sp, pp, ap, devs) != _config_of(s, i):
            name = space.names[i]
            return Proposal("config", name, s.with_config(name, sample=sp, parameter=pp,
                                                          attribute=ap, devices=devs))
    return None


def copy(rng: np.random.Generator, s: Strategy, space: SearchSpace) -> Proposal | None:
    """One free unit takes the parallel configuration (and stage) of a neighbour.

    >>> import memflow
    >>> from memflow.search.synthetic import chain_graph
    >>> g = chain_graph(3, batch=8)
    >>> sp = SearchSpace(g, memflow.Cluster.preset("4xV100-16GB"))
    >>> s = memflow.Strategy.data_parallel(g, 4).with_config("l1", sample=1, devices=["gpu2"])
    >>> p = copy(np.random.default_rng(1), s, sp)
    >>> p.unit, p.strategy.devices[1]
    ('l1', ('gpu0', 'gpu1', 'gpu2', 'gpu3'))
    """
    free = space.free()
    if not len(free) or space.n < 2:
        return None
    i = int(pick(rng, free))
    j = pick(rng, [k for k in (i - 1, i + 1) if 0 <= k < space.n])
    sp, pp, ap, devs = _config_of(s, j)
    if (sp, pp, ap, devs) == _config_of(s, i) and s.stage[i] == s.stage[j]:
        return None
    if not space.fits(i, pp) or ap > space.max_a[i]:
        return None
    name = space.names[i]
    return Proposal("copy", name, s.with_config(name, sample=sp, parameter=pp, attribute=ap,
                                                devices=devs, stage=int(s.stage[j])))


def swap(rng: np.random.Generator, s: Strategy, space: SearchSpace) -> Proposal | None:
    """One part of a free unit moves to another device; if that device already holds another
    part of the unit, the two parts trade places.

    >>> import memflow
    >>> from memflow.search.synthetic import chain_graph
    >>> g = chain_graph(2, batch=8)
    >>> sp = SearchSpace(g, memflow.Cluster.preset("4xV100-16GB"))
    >>> s = memflow.Strategy.data_parallel(g, ["gpu0", "gpu1"])
    >>> swap(np.random.default_rng(0), s, sp).strategy.devices
    (('gpu0', 'gpu1'), ('gpu0', 'gpu2'))
    """
    free = space.free()
    if not len(free) or len(space.devices) < 2:
        return None
    i = int(pick(rng, free))
    devs = list(s.devices[i])
    k = int(rng.integers(len(devs)))
    new = pick(rng, [d for d in space.devices if d != devs[k]])
    if new in devs:
        other = devs.index(new)
        devs[k], devs[other] = devs[other], devs[k]
    else:
        devs[k] = new
    name = space.names[i]
    return Proposal("swap", name, s.with_config(name, devices=devs))


def replicas(rng: np.random.Generator, s: Strategy, space: SearchSpace) -> Proposal | None:
    """Every unit gets another data-parallel degree together, with
    :meth:`~memflow.search.space.SearchSpace.on_replicas`; nothing while a unit is pinned (a
    pinned unit never changes, and a degree for all but it would not run).

    >>> import memflow
    >>> from memflow.search.synthetic import chain_graph
    >>> g = chain_graph(2, batch=8)
    >>> sp = SearchSpace(g, memflow.Cluster.preset("4xV100-16GB"))
    >>> p = replicas(np.random.default_rng(0), memflow.Strategy.data_parallel(g, 4), sp)
    >>> p.strategy.sample.tolist(), p.strategy.devices
    ([2, 2], (('gpu0', 'gpu1'), ('gpu0', 'gpu1')))
    """
    if space.pinned.any() or len(space.devices) < 2:
        return None
    choices = [d for d in space.sample_degrees(s.microbatches) if d != int(s.sample[0])]
    if not choices:
        return None
    d = int(pick(rng, choices))
    return Proposal("replicas", space.names[0], space.on_replicas(s, d))


def sequence(rng: np.random.Generator, s: Strategy, space: SearchSpace) -> Proposal | None:
    """One free split unit that may be sequence parallel (``SearchSpace.sequence``) turns it
    on or off; in the runnable space, nothing where export would not run the result.

    >>> import memflow
    >>> from memflow.zoo.llama import TINY
    >>> g = memflow.zoo.graph("tinyllama-1.1b", batch_size=4, units="blocks", **TINY)
    >>> sp = SearchSpace(g, memflow.Cluster.preset("2xV100-16GB"))
    >>> s = memflow.Strategy.data_parallel(g, 2).with_config(
    ...     ["layers.0", "layers.1"], sample=1, parameter=2, devices=["gpu0", "gpu1"])
    >>> s = s.with_config(["embed_tokens", "rotary", "norm", "lm_head"], sample=1,
    ...                   devices=["gpu0"])
    >>> p = sequence(np.random.default_rng(0), s, sp)
    >>> p.unit, p.strategy.sequence_parallel.tolist()
    ('layers.1', [False, False, False, True, False, False])
    """
    units = [int(i) for i in space.free() if s.parameter[i] > 1 and space.sequence[i]]
    if not units:
        return None
    i = int(pick(rng, units))
    name = space.names[i]
    option = s.with_config(name, sequence_parallel=not bool(s.sequence_parallel[i]))
    if space.runnable and not space.runs(option):
        return None
    return Proposal("sequence", name, option)


def microbatches(rng: np.random.Generator, s: Strategy,
                 space: SearchSpace) -> Proposal | None:
    """The whole strategy gets another micro-batch count (global: ``unit`` is empty), one
    that splits every replica's batch evenly.

    >>> import memflow
    >>> from memflow.search.synthetic import chain_graph
    >>> g = chain_graph(2, batch=16)
    >>> sp = SearchSpace(g, memflow.Cluster.preset("4xV100-16GB"))
    >>> microbatches(np.random.default_rng(0), memflow.Strategy.data_parallel(g, 4), sp
    ...              ).strategy.microbatches
    2
    """
    choices = microbatch_choices(s, space)
    if not choices:
        return None
    return Proposal("microbatches", "", with_microbatches(s, pick(rng, choices), space))


MOVES: dict[str, Move] = {**{m.__name__: dropping_sequence(m)
                             for m in (policy, segment, per_op)},
                          **{m.__name__: keeping_pipeline(dropping_states(dropping_sequence(m)))
                             for m in (config, copy, swap, replicas)},
                          "sequence": sequence,
                          "microbatches": keeping_pipeline(microbatches),
                          # shard checks its options with SearchSpace.runs, which holds
                          # keeping_pipeline's and keeping_states' rules: no wrapper re-checks
                          "shard": shard,
                          "precision": keeping_states(replicating(precision)),
                          "optimizer_place": keeping_states(optimizer_place)}
GLOBAL_MOVES = ("precision", "microbatches")
"""Moves that change the whole strategy: their proposals name no unit (``unit`` is "")."""
MEMORY_MOVES = ("policy", "segment", "per_op")
PARALLEL_MOVES = ("config", "copy", "swap", "replicas", "sequence")
DEFAULT_WEIGHTS = {"policy": 0.3, "segment": 0.2, "per_op": 0.05, "config": 0.2, "copy": 0.15,
                   "swap": 0.1, "replicas": 0.05, "sequence": 0.05,
                   **{m: MODEL_STATE_WEIGHTS[m] for m in EXPORTED_MODEL_STATE_MOVES}}
MICROBATCH_WEIGHTS = {"microbatches": 0.05}
"""The micro-batch move, opt-in (``moves={**DEFAULT_WEIGHTS, **MICROBATCH_WEIGHTS}``): on the
10-unit single-GPU chains of ``tests/search/test_quality.py`` it made 4 of 15 chains end over 1%
from the keep/recompute optimum — from an infeasible start the chain takes a feasible
accumulation that costs more than the optimum's recomputation and stays there, every way back
(one micro-batch, the right units recomputed) crossing infeasible strategies. Where memory and
parallelism interact (``benchmarks/bench_quality.py``) it wins: resnet50 at batch 1,024 on
4×V100-16GB fits with two micro-batches and nothing recomputed."""
FLEXFLOW_WEIGHTS = {"config": 0.6, "copy": 0.25, "swap": 0.15}
"""FlexFlow changes one operator's configuration at a time and never a memory policy (in the
runnable space its data-parallel degree stays the start's: name ``replicas`` to move it)."""
