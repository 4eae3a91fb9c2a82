"""The memory of one checkpoint block of a chain, from the simulator's own memory plan.

:func:`memflow.search.optimal_checkpointing` cuts a chain into *blocks*: a kept unit, or a
maximal run of recomputed units (a segment). Its dynamic program needs, for a block, the peak
over the block's own forward, recompute and backward passes of everything allocated around
them (the *local peak*), and the bytes that stay allocated through every later block (the
*held* bytes). This module computes both, exactly as the simulator's ledger would:

* the allocations and frees come from :func:`memflow.memory.plan.memory_plan`, which is probed
  with patterns in which every unit meets every combination of policies of its neighbours (a
  de Bruijn sequence), and each block is credited to the unit whose task allocates it;
* a block of unit ``v`` depends only on the policies of units ``v-1 … v+D``, where the *span*
  ``D`` is how far a tensor reaches beyond its producer (1 for a strict chain, 2 with in-place
  activations or views). :func:`span` measures it;
* on one stream time never decreases along program order, so the ledger's order of events is
  the program order, which :class:`Order` numbers.
"""
from __future__ import annotations

from itertools import product

import numpy as np

from ..errors import SearchError
from ..memory.arrays import GraphArrays
from ..memory.plan import A_BWD, A_FWD, A_OPT, A_RECOMP
from ..sim import Simulator
from ..strategy import Strategy

__all__ = ["KEEP_", "REC_", "START_", "END_", "span", "Order", "ChainMemory"]

KEEP_, REC_, START_, END_ = 0, 1, 2, 3
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


def de_bruijn(order: int) -> list[int]:
    """A cyclic 0/1 sequence in which every window of ``order`` bits appears once.

    >>> de_bruijn(3)
    [0, 0, 0, 1, 0, 1, 1, 1]
    """
    a, seq = [0] * (order + 1), []

    def db(t: int, p: int) -> None:
        if t > order:
            if order % p == 0:
                seq.extend(a[1:p + 1])
            return
        a[t] = a[t - p]
        db(t + 1, p)
        for j in range(a[t - p] + 1, 2):
            a[t] = j
            db(t + 1, t)
    db(1, 1)
    return seq


class Order:
    """Program order of a schedule: forward passes, then per unit in reverse its segment's
    recomputations and its backward, then the optimizer step. ``pos`` numbers task edges
    (start even, end odd); ``seg_end`` gives each recomputed unit's segment end."""

    def __init__(self, n: int, seg_end: np.ndarray):
        self.n, self.seg_end = n, seg_end

    def pos(self, anchor: np.ndarray) -> np.ndarray:
        n = self.n
        kind, unit, edge = anchor[..., 0], anchor[..., 1], anchor[..., 2]
        if not ((kind == A_FWD) | (kind == A_RECOMP) | (kind == A_BWD) | (kind == A_OPT)).all():
            raise SearchError("optimal_checkpointing met a transfer, offload or compression in "
                              "the memory plan; it plans keep/recompute on one placement only")
        u = np.minimum(np.maximum(unit, 0), n - 1)
        slot = 2 * n + (2 * n + 2) * (n - 1 - np.where(kind == A_RECOMP, self.seg_end[u], u))
        return np.where(kind == A_FWD, 2 * u + edge,
                        np.where(kind == A_RECOMP, slot + 2 * u + edge,
                                 np.where(kind == A_BWD, slot + 2 * n + edge,
                                          2 * n + (2 * n + 2) * n + edge)))

    def bwd_end(self, u: int) -> int:
        """Position of the end of unit ``u``'s backward."""
        return int(self.pos(np.array([A_BWD, u, 1])))

    def free(self, frees: np.ndarray, alloc: np.ndarray) -> np.ndarray:
        """Where each block (candidate anchors ``(k, 3, 3)``) is freed: its latest anchor,
        never before its allocating task ends (the ledger's rule)."""
        return np.maximum(self.pos(frees).max(1), alloc | 1)


class _Blocks:
    """Memory-plan blocks allocated by one unit in one neighbourhood, anchors symbolic."""

    def __init__(self, nbytes, alloc, free):
        self.nbytes = np.asarray(nbytes, np.float64)
        self.alloc = np.asarray(alloc, np.int64).reshape(-1, 3)
        self.free = np.asarray(free, np.int64).reshape(-1, 3, 3)
        self.tail = (self.free[:, :, 0] == A_OPT).any(1)   # parameter gradients


class ChainMemory:
    """Blocks of every unit of a chain in every neighbourhood, and block transitions."""

    def __init__(self, sim: Simulator, base: Strategy, D: int):
        n = self.n = sim.ga.n
        self.D = D
        self.items: list[dict[tuple, _Blocks]] = [{} for _ in range(n)]
        names = list(base.units)
        seq = de_bruijn(D + 2)
        for s in range(len(seq)):
            types = [seq[(u + s) % len(seq)] for u in range(n)]
            plan = sim.plan(base.with_policy(recompute=[names[u] for u in range(n)
                                                        if types[u] == REC_]))
            self.persistent = float(plan.persistent[0].sum())
            owner = np.where(plan.alloc[:, 0] == A_OPT, -1, plan.alloc[:, 1])
            self.opt_bytes = float(plan.bytes[owner < 0].sum())
            t = dict(enumerate(types))
            for u in range(n):
                mine = owner == u
                self.items[u][self.context(u, t)] = _Blocks(plan.bytes[mine], plan.alloc[mine],
                                                            plan.free[mine])
        # parameter gradients do not depend on the neighbourhood
        any_ctx = [next(iter(self.items[u].values())) for u in range(n)]
        self.tail = np.array([float(x.nbytes[x.tail].sum()) for x in any_ctx])
        self.tail_after = np.concatenate([np.cumsum(self.tail[::-1])[::-1][1:], [0.0]])

    def context(self, u: int, t: dict[int, int]) -> tuple[int, ...]:
        """Policies of units ``u-1 … u+D`` (unknown ones kept; START/END outside the chain)."""
        return tuple(START_ if v < 0 else END_ if v >= self.n else t.get(v, KEEP_)
                     for v in range(u - 1, u + self.D + 1))

    def contexts(self) -> list[tuple[int, ...]]:
        """Every neighbourhood a unit can have (for tests)."""
        return list(product((KEEP_, REC_), repeat=self.D + 2))

    def transition(self, a: int, b: int, t: dict[int, int]) -> tuple[float, float]:
        """Local peak of block ``a..b`` and the bytes newly held through the next block.

        ``t`` gives the policy of units ``a-D-1 … b+D``. Blocks allocated before ``a`` that
        are held through it are counted in the DP's held bytes already; the parameter
        gradients of units after ``b`` are in ``tail_after[b]``.
        """
        n, D = self.n, self.D
        seg_end = np.arange(n)
        run_end = None
        for v in sorted(t, reverse=True):
            if 0 <= v < n and t[v] == REC_:
                run_end = v if run_end is None else run_end
                seg_end[v] = run_end
            else:
                run_end = None
        order = Order(n, seg_end)
        groups = [range(max(0, a - D), a), range(a, b + 1), range(b + 1, min(n, b + D + 1))]
        parts = [[self.items[v][self.context(v, t)] for v in g] for g in groups]
        flat = [p for g in parts for p in g]
        which = np.concatenate([np.full(len(p.nbytes), k) for k, g in enumerate(parts)
                                for p in g])
        nbytes = np.concatenate([p.nbytes for p in flat])
        alloc = order.pos(np.concatenate([p.alloc for p in flat]))
        free = order.free(np.concatenate([p.free for p in flat]), alloc)
        tail = np.concatenate([p.tail for p in flat])

        def through(c: int) -> np.ndarray:
            return (alloc <= 2 * c) & (free >= order.bwd_end(c))

        keep = ~(((which == 0) & through(a)) | ((which == 2) & tail))
        pts = [2 * u for u in range(a, b + 1)] + \
            [int(order.pos(np.array([A_BWD, u, 0]))) for u in range(a, b + 1)]
        if t[a] == REC_:
            pts += [int(order.pos(np.array([A_RECOMP, u, 0]))) for u in range(a, b + 1)]
        at = np.array(pts)
        live = (alloc[None, keep] <= at[:, None]) & (free[None, keep] >= at[:, None])
        cover = live @ nbytes[keep] + np.where(at >= 2 * n, self.tail_after[b], 0.0)
        held = 0.0
        if b + 1 < n:
            now = through(b + 1)
            new = ((which == 1) & now) | ((which == 0) & now & ~through(a))
            held = float(nbytes[new].sum())
        return float(cover.max(initial=0.0)), held
