"""The chain model: the per-unit numbers the checkpointing DP reads, from the simulator.

:func:`~memflow.planners.checkpointing.optimal_checkpointing` cuts a chain into *blocks*: a
kept unit, an offloaded unit, or a maximal run of recomputed units (a segment). Its dynamic
program needs, for a block, the peak over the block's own forward, recompute and backward
passes of everything allocated around them (the *local peak*), the bytes that stay allocated
through every later block (the *held* bytes), and the time the block adds. This module computes
them, exactly as the simulator's ledger would:

* the allocations and frees come from :func:`memflow.memory.blocks.step_blocks`, which is probed
  with patterns in which every unit meets every combination of policies of its neighbours (a
  de Bruijn sequence), and each block is credited to the unit whose task allocates it;
* a block of unit ``v`` depends only on the policies of units ``v-1 … v+D``, where the *span*
  ``D`` is how far a tensor reaches beyond its producer (1 for a strict chain, 2 with in-place
  activations or views). :func:`span` measures it and :func:`chain_violation` says when a
  graph reaches too far (``MAX_SPAN``) to be planned as a chain;
* on one stream time never decreases along program order, so the ledger's order of events is
  the program order, which :func:`~memflow.planners.checkpointing.order.position` numbers;
* a recomputed unit adds its forward time (:func:`forward_times`); an offloaded unit's
  transfers follow the simulator's vDNN rule: the next forward waits for the offload (so its
  device copy is gone before that forward starts), and the prefetch, issued when the next
  unit's backward starts, must land before the unit's own backward. The time an offload adds
  is therefore its offload plus whatever of its prefetch the next backward does not cover
  (:meth:`ChainMemory.offload_time`), and the events keep their place in program order.

>>> import memflow
>>> from memflow.search.synthetic import chain_graph
>>> g = chain_graph(4)
>>> sim = memflow.sim.Simulator(g, memflow.Cluster.preset("1xV100-16GB"))
>>> chain = ChainMemory(sim, memflow.Strategy.single_device(g), span(sim.ga)[0])
>>> local, held = chain.transition(1, 1, {v: KEEP_ for v in range(-1, 4)})
>>> local > held > 0                 # unit 1 kept: what it saves is held through the rest
True
"""
from __future__ import annotations

import numpy as np

from ...memory.arrays import GraphArrays, graph_arrays
from ...memory.blocks import A_OPT
from ...sim import Simulator
from ...sim.kinds import K_BWD, K_FWD, K_OFFLOAD, K_PREFETCH
from ...strategy import Strategy
from .order import check_kinds
from .transitions import BASE, block_transitions, context_code

__all__ = ["KEEP_", "REC_", "OFF_", "START_", "END_", "POLICY", "MAX_SPAN", "span",
           "chain_violation", "forward_times", "ChainMemory"]

# the DP's policy codes; START_ and END_ stand for the units before and after the chain
KEEP_, REC_, OFF_, START_, END_ = 0, 1, 2, 3, 4
POLICY = {KEEP_: "keep", REC_: "recompute", OFF_: "offload"}
MAX_SPAN = 4


def span(ga: GraphArrays) -> tuple[int, str]:
    """How far beyond its first user a tensor lives, in units, and a sentence on the widest.

    >>> from memflow.memory.arrays import graph_arrays
    >>> from memflow.search.synthetic import chain_graph
    >>> span(graph_arrays(chain_graph(4)))[0]
    1
    """
    n, widest, why = ga.n, 0, ""
    for t in range(len(ga.bytes)):
        p = int(ga.producer[t])
        users = set(ga.readers[t]) | set(ga.savers[t])
        lo = p if p >= 0 else min(users, default=0)
        hi = max(users | {lo})
        if ga.is_output[t] and p != n - 1:
            hi = n - 1
        if hi - lo > widest:
            src = ga.names[p] if p >= 0 else "the model's input"
            widest, why = hi - lo, (f"tensor {t} from {src} is used {hi - lo} units later, by "
                                    f"{ga.names[hi]}")
    return max(widest, 1), why


def chain_violation(graph) -> str | None:
    """Why ``graph`` is too far from a chain for optimal checkpointing (a sentence naming the
    tensor and units), or None: every tensor must be used within ``MAX_SPAN`` units of its
    producer, and the model's outputs must come from the last units.

    >>> from memflow.search.synthetic import chain_graph
    >>> chain_violation(chain_graph(4)) is None
    True
    """
    D, why = span(graph_arrays(graph))
    return why if D > MAX_SPAN else None


def forward_times(run, n: int) -> np.ndarray:
    """Seconds of each of the ``n`` units' forward passes in a simulated run: what recomputing
    the unit adds.

    >>> import memflow
    >>> from memflow.search.synthetic import chain_graph
    >>> g = chain_graph(3)
    >>> run = memflow.sim.Simulator(g, memflow.Cluster.preset("1xV100-16GB")).run(
    ...     memflow.Strategy.single_device(g))
    >>> bool((forward_times(run, 3) > 0).all())
    True
    """
    fwd = np.zeros(n)
    kinds = np.asarray(run.tasks.kind)
    np.add.at(fwd, np.asarray(run.tasks.unit)[kinds == K_FWD], run.duration[kinds == K_FWD])
    return fwd


def de_bruijn(order: int, k: int = 2) -> list[int]:
    """A cyclic sequence over ``0 … k-1`` in which every window of ``order`` appears once.

    >>> de_bruijn(3)
    [0, 0, 0, 1, 0, 1, 1, 1]
    >>> len(de_bruijn(3, 3))
    27
    """
    a, seq = [0] * (order + 1), []

    def db(t: int, p: int) -> None:
        if t > order:
            if order % p == 0:
                seq.extend(a[1:p + 1])
            return
        a[t] = a[t - p]
        db(t + 1, p)
        for j in range(a[t - p] + 1, k):
            a[t] = j
            db(t + 1, t)
    db(1, 1)
    return seq


class _Blocks:
    """Memory-plan blocks allocated by one unit in one neighbourhood, anchors symbolic."""

    def __init__(self, nbytes, alloc, free):
        self.nbytes = np.asarray(nbytes, np.float64)
        self.alloc = np.asarray(alloc, np.int64).reshape(-1, 3)
        self.free = np.asarray(free, np.int64).reshape(-1, 3, 3)
        self.tail = (self.free[:, :, 0] == A_OPT).any(1)   # parameter gradients


class ChainMemory:
    """Blocks of every unit of a chain in every neighbourhood, and block transitions.

    ``offload`` adds offloading as a third policy (probing costs 3^(D+2) simulations instead
    of 2^(D+2) memory plans, to time the transfers)."""

    def __init__(self, sim: Simulator, base: Strategy, D: int, offload: bool = False):
        n = self.n = sim.ga.n
        self.D = D
        self.items: list[dict[tuple, _Blocks]] = [{} for _ in range(n)]
        self.transfer: list[dict[tuple, tuple[float, float]]] = [{} for _ in range(n)]
        names = list(base.units)
        seq = de_bruijn(D + 2, 3 if offload else 2)
        for s in range(len(seq)):
            types = [seq[(u + s) % len(seq)] for u in range(n)]
            probe = base.with_policy({names[u]: POLICY[x] for u, x in enumerate(types)})
            run = sim.run(probe) if offload else None
            plan = run.blocks if offload else sim.blocks(probe)
            self.persistent = float(plan.persistent[0].sum())
            device = ~plan.on_host
            owner = np.where(plan.alloc[:, 0] == A_OPT, -1, plan.alloc[:, 1])
            self.opt_bytes = float(plan.bytes[device & (owner < 0)].sum())
            t = dict(enumerate(types))
            for u in range(n):
                mine = device & (owner == u)
                ctx = self.context(u, t)
                self.items[u][ctx] = _Blocks(plan.bytes[mine], plan.alloc[mine], plan.free[mine])
                if offload:
                    self.transfer[u][ctx] = _durations(run, u)
        # parameter gradients do not depend on the neighbourhood
        any_ctx = [next(iter(self.items[u].values())) for u in range(n)]
        self.tail = np.array([float(x.nbytes[x.tail].sum()) for x in any_ctx])
        self.tail_after = np.concatenate([np.cumsum(self.tail[::-1])[::-1][1:], [0.0]])
        self._flatten()
        if offload:
            kinds, units = np.asarray(run.tasks.kind), np.asarray(run.tasks.unit)
            bwd = kinds == K_BWD
            self.compute = {K_BWD: np.bincount(units[bwd], run.duration[bwd], minlength=n)}

    def context(self, u: int, t: dict[int, int]) -> tuple[int, ...]:
        """Policies of units ``u-1 … u+D`` (unknown ones kept; START/END outside the chain)."""
        return tuple(START_ if v < 0 else END_ if v >= self.n else t.get(v, KEEP_)
                     for v in range(u - 1, u + self.D + 1))

    def offload_time(self, u: int, t: dict[int, int]) -> float:
        """Seconds offloading unit ``u`` adds to a step: its offload (the next forward waits
        for it) and the part of its prefetch the next unit's backward does not cover (all of
        it for the last unit, whose backward comes first)."""
        off, pre = self.transfer[u][self.context(u, t)]
        cover = self.compute[K_BWD][u + 1] if u + 1 < self.n else 0.0
        return off + max(0.0, pre - cover)

    def _flatten(self) -> None:
        """The probed blocks as one table for :func:`.transitions.block_transitions`."""
        n, D = self.n, self.D
        self.ctx_id = np.full((n, BASE ** (D + 2)), -1, np.int64)
        rows = [(u, ctx, x) for u in range(n) for ctx, x in self.items[u].items()]
        sizes = np.array([len(x.nbytes) for _, _, x in rows], np.int64)
        self.stop = np.cumsum(sizes)
        self.start = self.stop - sizes
        for k, (u, ctx, _) in enumerate(rows):
            self.ctx_id[u, context_code(ctx)] = k
        self.nbytes = np.concatenate([x.nbytes for _, _, x in rows])
        self.alloc = np.concatenate([x.alloc for _, _, x in rows])
        self.free = np.concatenate([x.free for _, _, x in rows])
        self.tails = np.concatenate([x.tail for _, _, x in rows])
        check_kinds(np.concatenate([self.alloc[:, 0], self.free[:, :, 0].ravel()]))
        # the most any schedule can hold: every unit's largest blocks (rotor's slots scale)
        per_row = np.array([x.nbytes.sum() for _, _, x in rows])
        units = np.array([u for u, _, _ in rows])
        self.most_held = float(sum(per_row[units == u].max() for u in range(n)))

    def transitions(self, a: np.ndarray, b: np.ndarray, hist: np.ndarray, kind: np.ndarray,
                    after: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Local peak and newly held bytes of many blocks at once (see :mod:`.transitions`):
        block ``a[i]..b[i]`` of policy ``kind[i]``, ``hist[i]`` the policies of the ``D+1``
        units before it, ``after[i]`` of the ``D`` after it."""
        local, held = block_transitions(
            np.asarray(a, np.int64), np.asarray(b, np.int64),
            np.asarray(hist, np.int64).reshape(len(a), self.D + 1),
            np.asarray(kind, np.int64), np.asarray(after, np.int64).reshape(len(a), self.D),
            self.n, self.D, self.ctx_id, self.start, self.stop, self.nbytes, self.alloc,
            self.free, self.tails, self.tail_after)
        return local, held

    def transition(self, a: int, b: int, t: dict[int, int]) -> tuple[float, float]:
        """Local peak of block ``a..b`` and the bytes newly held through the next block.

        ``t`` gives the policy of units ``a-D-1 … b+D``. Blocks allocated before ``a`` that
        are held through it are counted in the DP's held bytes already; the parameter
        gradients of units after ``b`` are in ``tail_after[b]``.
        """
        def pol(v: int) -> int:
            return START_ if v < 0 else END_ if v >= self.n else t.get(v, KEEP_)
        D = self.D
        local, held = self.transitions(
            [a], [b], [pol(v) for v in range(a - D - 1, a)], [pol(a)],
            [pol(v) for v in range(b + 1, b + D + 1)])
        return float(local[0]), float(held[0])


def _durations(run, u: int) -> tuple[float, float]:
    """Seconds of unit ``u``'s offload and prefetch in a simulated run (0 when it has none)."""
    kinds, units = np.asarray(run.tasks.kind), np.asarray(run.tasks.unit)
    out = []
    for k in (K_OFFLOAD, K_PREFETCH):
        d = run.duration[(kinds == k) & (units == u)]
        out.append(float(d.max(initial=0.0)))
    return out[0], out[1]
