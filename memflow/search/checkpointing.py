"""Optimal checkpointing of a chain: the best keep/recompute schedule under a memory limit.

What is optimal, exactly. The schedules are those memflow can express and PyTorch runs: every
unit is kept or recomputed, and each maximal run of recomputed units is one checkpoint segment
(``torch.utils.checkpoint``: its inputs are held, what its units save is dropped and rebuilt
by one re-run of the segment's forward just before its backward). Among all ``2^n`` such
assignments, :func:`optimal_checkpointing` returns one of least compute time whose peak memory
— in the simulator's own memory model, block by block — stays within the limit. It is a
dynamic program over segmentations, as rotor's is over chains (Beaumont et al., "Optimal
checkpointing for heterogeneous chains"), with these differences:

* memory is not discretized: each state keeps the Pareto front of (bytes held for backward,
  time), so the optimum is exact; ``slots=S`` rounds the held bytes up to multiples of
  ``limit / S`` as rotor does, which bounds the work and can only lose schedules, never return
  one that does not fit;
* the memory of a segment is not a formula: the allocations and frees come from
  :func:`memflow.memory.plan.memory_plan` (probed once per unit and neighbourhood), placed in
  program order, so the peak the DP predicts is the simulator's peak.

The time is the keep-everything time plus the forward time of every recomputed unit, which
is the simulated iteration time on one device (all tasks share one stream). On a data-parallel
``base`` the memory is still exact, the time is the compute time (gradient all-reduces overlap
it), and the result reports the simulated time.

It applies to chains: every activation is used by its producer and the next unit only (and
the model's output comes from the last unit). ``units="blocks"`` usually gives one.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import SearchError
from ..memory.arrays import graph_arrays
from ..memory.plan import A_BWD, A_FWD, A_OPT, A_RECOMP
from ..sim import Simulator
from ..sim.expand import K_FWD
from ..strategy import Strategy
from .cost import memory_limits

__all__ = ["optimal_checkpointing", "CheckpointResult", "chain_violation"]

KEEP_, REC_, START_, END_ = 0, 1, 2, 3
_DE_BRUIJN = (0, 0, 0, 1, 0, 1, 1, 1)   # every 3-window of {keep, recompute}, cyclically


@dataclass(frozen=True)
class CheckpointResult:
    """An optimal schedule, what the DP predicted and what the simulator says of it."""

    strategy: Strategy
    time: float               # simulated iteration time
    peak: float               # simulated peak of the most loaded device
    feasible: bool
    predicted_time: float
    predicted_peak: float
    memory_limit: float
    recomputed: tuple[str, ...]


def chain_violation(graph) -> str | None:
    """Why ``graph`` is not a chain (a sentence naming the tensor and units), or None.

    >>> from memflow.search.synthetic import chain_graph
    >>> chain_violation(chain_graph(4)) is None
    True
    """
    ga = graph_arrays(graph)
    n = ga.n
    for t in range(len(ga.bytes)):
        p = int(ga.producer[t])
        users = set(ga.readers[t]) | set(ga.savers[t])
        far = sorted(u for u in users if u not in (p, p + 1))
        src = ga.names[p] if p >= 0 else "the model's input"
        if far:
            return (f"tensor {t} from {src} is used by {[ga.names[u] for u in far]}, beyond the "
                    "next unit")
        if ga.is_output[t] and p != n - 1:
            return f"tensor {t} from {src} is a model output but not from the last unit"
    return None


class _Anchors:
    """Allocations and frees of the blocks one unit owns in one neighbourhood, symbolic."""

    def __init__(self, nbytes, alloc, free):
        self.nbytes = np.asarray(nbytes, np.float64)
        self.alloc = np.asarray(alloc, np.int64).reshape(-1, 3)
        self.free = np.asarray(free, np.int64).reshape(-1, 3, 3)
        self.tail = (self.free[:, :, 0] == A_OPT).any(1)


class _Order:
    """Program order of a schedule around one block: forward passes, then per unit in reverse
    its segment's recomputations and its backward, then the optimizer step.

    ``pos`` numbers task edges (start even, end odd). On one stream time never decreases
    along program order, so the ledger's rule — free a block at its latest candidate anchor,
    the later in program order at equal times — is the largest position.
    """

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

    def free(self, frees: np.ndarray, alloc: np.ndarray) -> np.ndarray:
        """Position at which each block (candidate anchors ``(k, 3, 3)``) is freed."""
        return np.maximum(self.pos(frees).max(1), alloc | 1)


class _Chain:
    """The per-unit blocks of a chain, probed from the memory plan."""

    def __init__(self, sim: Simulator, base: Strategy):
        ga = sim.ga
        self.n = n = ga.n
        self.items: list[dict[tuple[int, int, int], _Anchors]] = [{} for _ in range(n)]
        names = list(base.units)
        for s in range(len(_DE_BRUIJN)):
            types = [_DE_BRUIJN[(u + s) % len(_DE_BRUIJN)] for u in range(n)]
            probe = base.with_policy(recompute=[names[u] for u in range(n) if types[u] == REC_])
            plan = sim.plan(probe)
            self.persistent = float(plan.persistent[0].sum())
            owner = np.where(plan.alloc[:, 0] == A_OPT, -1, plan.alloc[:, 1])
            opt = owner < 0
            self.opt_bytes = float(plan.bytes[opt].sum())
            for u in range(n):
                ctx = (START_ if u == 0 else types[u - 1], types[u],
                       END_ if u == n - 1 else types[u + 1])
                mine = owner == u
                self.items[u][ctx] = _Anchors(plan.bytes[mine], plan.alloc[mine],
                                              plan.free[mine])
        # parameter gradients (freed by the optimizer) do not depend on the neighbourhood
        any_ctx = [next(iter(self.items[u].values())) for u in range(n)]
        self.tail = np.array([float(x.nbytes[x.tail].sum()) for x in any_ctx])
        self.tail_after = np.concatenate([np.cumsum(self.tail[::-1])[::-1][1:], [0.0]])

    def _ctx(self, u: int, t: dict[int, int]) -> tuple[int, int, int]:
        return (START_ if u == 0 else t.get(u - 1, KEEP_), t[u],
                END_ if u == self.n - 1 else t.get(u + 1, KEEP_))

    def transition(self, a: int, b: int, kind: int, tp: int, tn: int) -> tuple[float, float]:
        """Local peak over the points of block ``a..b`` and the bytes it leaves held."""
        n = self.n
        t = {u: kind for u in range(a, b + 1)}
        if a > 0:
            t[a - 1] = tp
        if b + 1 < n:
            t[b + 1] = tn
        seg_end = np.arange(n)
        if kind == REC_:
            seg_end[a:b + 1] = b
        order = _Order(n, seg_end)
        parts = [self.items[u][self._ctx(u, t)] for u in range(a, b + 1)]
        own = len(parts)
        if a > 0:
            parts.append(self.items[a - 1][self._ctx(a - 1, t)])
        if b + 1 < n:
            parts.append(self.items[b + 1][self._ctx(b + 1, t)])
        nbytes = np.concatenate([p.nbytes for p in parts])
        alloc = order.pos(np.concatenate([p.alloc for p in parts]))
        free = order.free(np.concatenate([p.free for p in parts]), alloc)
        which = np.concatenate([np.full(len(p.nbytes), k) for k, p in enumerate(parts)])
        tail = np.concatenate([p.tail for p in parts])

        def bwd(u: int, edge: int) -> int:
            return int(order.pos(np.array([A_BWD, u, edge])))

        # blocks of unit a-1 held through this one are in the held bytes already, and the
        # next unit's parameter gradients are in tail_after
        drop = (which == own) & (alloc <= 2 * a) & (free >= bwd(a, 1)) if a > 0 else \
            np.zeros(len(which), bool)
        if b + 1 < n:
            drop |= (which == len(parts) - 1) & tail
        keep = ~drop
        nbytes, alloc, free, which = nbytes[keep], alloc[keep], free[keep], which[keep]
        pts = [2 * u for u in range(a, b + 1)] + [bwd(u, 0) for u in range(a, b + 1)]
        if kind == REC_:
            pts += [int(order.pos(np.array([A_RECOMP, u, 0]))) for u in range(a, b + 1)]
        at = np.array(pts)
        cover = ((alloc[None, :] <= at[:, None]) & (free[None, :] >= at[:, None])) @ nbytes
        cover = cover + np.where(at >= 2 * n, self.tail_after[b], 0.0)
        held = 0.0
        if b + 1 < n:
            mine = (which < own) & (alloc <= 2 * (b + 1)) & (free >= bwd(b + 1, 1))
            held = float(nbytes[mine].sum())
        return float(cover.max(initial=0.0)), held


def _resolve(device: Any):
    from ..hardware import Cluster
    if isinstance(device, str):
        return Cluster.preset(device)
    if hasattr(device, "devices") and hasattr(device, "arrays"):
        return device
    raise SearchError(f"device must be a Cluster or a preset name, got {device!r}")


def optimal_checkpointing(graph, device: Any, memory_limit: Any = None, *,
                          base: Strategy | None = None, optimizer: str = "sgd",
                          precision: str | None = None, slots: int | None = None
                          ) -> CheckpointResult:
    """The least-time keep/recompute schedule of a chain that fits ``memory_limit``.

    ``device`` is a :class:`memflow.Cluster` or a preset name: the chain runs on its first
    device, or on ``base``'s placement (one placement for every unit, e.g. data parallel).
    ``memory_limit`` (bytes or ``"8GB"``) defaults to the device's capacity. Raises
    :class:`~memflow.errors.SearchError` when the graph is not a chain or nothing fits.

    >>> from memflow.search.synthetic import chain_graph
    >>> g = chain_graph(8, batch=16384, width=64)       # keeping everything peaks at 107 MB
    >>> res = optimal_checkpointing(g, "1xV100-16GB", 80e6)
    >>> res.feasible, res.peak <= 80e6, res.peak == res.predicted_peak
    (True, True, True)
    >>> abs(res.time - res.predicted_time) < 1e-12, res.recomputed
    (True, ('l0', 'l1'))
    """
    cluster = _resolve(device)
    why = chain_violation(graph)
    if why is not None:
        raise SearchError(f"optimal_checkpointing needs a chain: {why}; capture with "
                          "units='blocks' or use memflow.search.exhaustive")
    if base is None:
        base = Strategy.single_device(graph, str(cluster.devices.index[0]))
    base.validate(graph, cluster)
    if len(base.layouts) != 1 or (base.stage >= 0).any() or base.microbatches != 1:
        raise SearchError("optimal_checkpointing needs one placement for every unit, no "
                          "pipeline stages and one micro-batch; got "
                          f"{len(base.layouts)} placements, microbatches={base.microbatches}")
    base = base.with_policy(keep=list(graph.names))
    sim = Simulator(graph, cluster, optimizer=optimizer, precision=precision)
    used = cluster.devices.index.get_indexer(list(base.devices[0]))
    limit = float(memory_limits(cluster, memory_limit)[used].min())
    run = sim.run(base)
    fwd = np.zeros(len(graph))
    kinds = np.asarray(run.tasks.kind)
    np.add.at(fwd, np.asarray(run.tasks.unit)[kinds == K_FWD], run.duration[kinds == K_FWD])
    chain = _Chain(sim, base)
    n = chain.n
    rec_ok = sim.ga.recomputable
    budget = limit - chain.persistent
    quantum = budget / slots if slots else 0.0
    fronts: dict[tuple[int, int, int], list] = {(0, START_, k): [(0.0, 0.0, 0.0, None)]
                                                for k in (KEEP_, REC_) if k == KEEP_ or rec_ok[0]}
    memo: dict[tuple, tuple[float, float]] = {}
    finals = []
    for a in range(n):
        for (sa, tp, ta) in sorted(k for k in fronts if k[0] == a):
            front = _pareto(fronts.pop((sa, tp, ta)))
            ends = [a] if ta == KEEP_ else _run_ends(rec_ok, a)
            for b in ends:
                nexts = [END_] if b == n - 1 else [KEEP_] + ([REC_] if ta == KEEP_ and
                                                             rec_ok[b + 1] else [])
                for tn in nexts:
                    key = (a, b, ta, tp, tn)
                    if key not in memo:
                        memo[key] = chain.transition(a, b, ta, tp, tn)
                    local, held = memo[key]
                    dt = float(fwd[a:b + 1].sum()) if ta == REC_ else 0.0
                    for i, (H, T, P, _) in enumerate(front):
                        if H + local > budget * (1 + 1e-12):
                            break          # fronts are sorted by held bytes
                        H2 = H + held
                        if quantum:
                            H2 = math.ceil(H2 / quantum - 1e-9) * quantum
                        entry = (H2, T + dt, max(P, H + local), (a, b, ta, front, i))
                        if b == n - 1:
                            finals.append(entry)
                        else:
                            fronts.setdefault((b + 1, ta, tn), []).append(entry)
    opt_peak = chain.opt_bytes + float(chain.tail.sum())
    finals = [f for f in finals if opt_peak <= budget]
    if not finals:
        raise SearchError(f"no keep/recompute schedule of {graph.meta.get('model', 'the chain')}"
                          f" fits memory_limit={limit:,.0f} bytes on {list(base.devices[0])}")
    H, T, P, back = min(finals, key=lambda f: (f[1], f[2]))
    rec: list[int] = []
    while back is not None:
        a, b, ta, front, i = back
        if ta == REC_:
            rec += range(a, b + 1)
        back = front[i][3]
    names = [graph.names[u] for u in sorted(rec)]
    label = "optimal checkpointing" if len(base.devices[0]) == 1 else \
        f"{base.name}, optimal checkpointing"
    best = base.with_policy(recompute=names).with_schedule(name=label)
    ev = sim.evaluate(best)
    peak = float(ev.peak[used].max())
    return CheckpointResult(best, ev.iteration_time, peak, bool(peak <= limit),
                            run.iteration_time + T, chain.persistent + max(P, opt_peak), limit,
                            tuple(names))


def _run_ends(rec_ok: np.ndarray, a: int) -> list[int]:
    """Last units of the recompute segments that may start at ``a``."""
    out = []
    for b in range(a, len(rec_ok)):
        if not rec_ok[b]:
            break
        out.append(b)
    return out


def _pareto(entries: list) -> list:
    """Entries not beaten in both held bytes and time, sorted by held bytes."""
    out = []
    best_t = math.inf
    for e in sorted(entries, key=lambda e: (e[0], e[1], e[2])):
        if e[1] < best_t:
            out.append(e)
            best_t = e[1]
    return out
