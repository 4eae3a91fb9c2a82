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
  :func:`memflow.memory.blocks.step_blocks` (probed once per unit and neighbourhood), placed in
  program order, so the peak the DP predicts is the simulator's peak.

The time is the keep-everything time plus the forward time of every recomputed unit, which
is the simulated iteration time on one device (all tasks share one stream). On a data-parallel
``base`` the memory is still exact, the time is the compute time (gradient all-reduces overlap
it), and the result reports the simulated time.

It applies to chains: graphs in which every tensor is used within a few units of its producer
(``MAX_SPAN``; one for a strict chain, two where in-place activations or views make a tensor
reach one unit further) and the model's outputs come from the last units. The DP's state then
carries the policies of that many units on each side (:mod:`memflow.search.chainmem`).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..errors import SearchError
from ..memory.arrays import graph_arrays
from ..sim import Simulator
from ..sim.kinds import K_FWD
from ..strategy import Strategy
from .chainmem import (END_, KEEP_, MAX_SPAN, OFF_, POLICY, REC_, START_, ChainMemory,
                       span)
from .cost import memory_limits

__all__ = ["optimal_checkpointing", "CheckpointResult", "chain_violation", "CHECKPOINT"]

CHECKPOINT = ("keep", "recompute")


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
    offloaded: tuple[str, ...] = ()


def chain_violation(graph) -> str | None:
    """Why ``graph`` is too far from a chain for :func:`optimal_checkpointing` (a sentence
    naming the tensor and units), or None: every tensor must be used within ``MAX_SPAN`` units
    of its producer, and the model's outputs must come from the last units.

    >>> from memflow.search.synthetic import chain_graph
    >>> chain_violation(chain_graph(4)) is None
    True
    """
    D, why = span(graph_arrays(graph))
    return why if D > MAX_SPAN else None


def _resolve(device: Any):
    from ..hardware import Cluster
    if isinstance(device, str):
        return Cluster.preset(device)
    if hasattr(device, "devices") and hasattr(device, "arrays"):
        return device
    raise SearchError(f"device must be a Cluster or a preset name, got {device!r}")


def optimal_checkpointing(graph, device: Any, memory_limit: Any = None, *,
                          base: Strategy | None = None, policies: Sequence[str] = CHECKPOINT,
                          optimizer: str = "sgd", precision: str | None = None,
                          slots: int | None = None) -> CheckpointResult:
    """The least-time keep/recompute schedule of a chain that fits ``memory_limit``.

    ``device`` is a :class:`memflow.Cluster` or a preset name: the chain runs on its first
    device, or on ``base``'s placement (one placement for every unit, e.g. data parallel).
    ``memory_limit`` (bytes or ``"8GB"``) defaults to the device's capacity.
    ``policies=("keep", "recompute", "offload")`` adds offloading as a third choice per unit,
    its time being what the simulator's transfers add
    (:meth:`~memflow.search.chainmem.ChainMemory.offload_time`).
    Raises :class:`~memflow.errors.SearchError` when the graph is not a chain or nothing fits.

    >>> from memflow.search.synthetic import chain_graph
    >>> g = chain_graph(8, batch=16384, width=64)       # keeping everything peaks at 107 MB
    >>> res = optimal_checkpointing(g, "1xV100-16GB", 80e6)
    >>> res.feasible, res.peak <= 80e6, res.peak == res.predicted_peak
    (True, True, True)
    >>> abs(res.time - res.predicted_time) < 1e-12, res.recomputed
    (True, ('l0', 'l1'))
    """
    cluster = _resolve(device)
    bad = [p for p in policies if p not in POLICY.values()]
    if bad or "keep" not in policies:
        raise SearchError(f"optimal_checkpointing: policies={list(policies)} must include "
                          f"'keep' and be among {list(POLICY.values())}")
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
    chain = ChainMemory(sim, base, span(sim.ga)[0], offload="offload" in policies)
    n = len(graph)
    allowed = [[KEEP_] + ([REC_] if "recompute" in policies and sim.ga.recomputable[v] else [])
               + ([OFF_] if "offload" in policies else []) for v in range(n)]
    T, P, types = _solve(chain, fwd, allowed, limit - chain.persistent, slots)
    if types is None:
        raise SearchError(f"no {'/'.join(policies)} schedule of "
                          f"{graph.meta.get('model', 'the chain')} fits memory_limit="
                          f"{limit:,.0f} bytes on {list(base.devices[0])}")
    chosen = {k: tuple(graph.names[u] for u in range(n) if types[u] == k) for k in (REC_, OFF_)}
    label = "optimal checkpointing" + (" and offloading" if chosen[OFF_] else "")
    if len(base.devices[0]) > 1:
        label = f"{base.name}, {label}"
    best = base.with_policy(recompute=list(chosen[REC_]), offload=list(chosen[OFF_]))
    best = best.with_schedule(name=label)
    ev = sim.evaluate(best)
    peak = float(ev.peak[used].max())
    return CheckpointResult(best, ev.iteration_time, peak, bool(peak <= limit),
                            run.iteration_time + T, chain.persistent + P, limit,
                            chosen[REC_], chosen[OFF_])


def _solve(chain: ChainMemory, fwd: np.ndarray, allowed: list[list[int]], budget: float,
           slots: int | None) -> tuple[float, float, list[int] | None]:
    """The DP: (extra time, peak above the persistent bytes, policy per unit) of the best
    schedule within ``budget``; ``None`` policies when nothing fits.

    States are (first unit of the next block, policies of the ``D+1`` units before it, the
    committed policies of it and the ``D-1`` after); each keeps a Pareto front of
    (held bytes, time, peak so far, back pointer)."""
    n, D = chain.n, chain.D
    quantum = budget / slots if slots else 0.0
    fronts: dict[tuple, list] = {}
    for com in _assignments(0, D, allowed, {}):
        fronts[(0, (START_,) * (D + 1), com)] = [(0.0, 0.0, 0.0, None)]
    memo: dict[tuple, tuple[float, float, float]] = {}
    finals = []
    for a in range(n):
        for key in sorted(k for k in fronts if k[0] == a):
            _, hist, com = key
            front = _pareto(fronts.pop(key))
            known = {v: x for v, x in zip(range(a - D - 1, a + D), hist + com) if 0 <= v < n}
            kind = com[0]
            for b in _block_ends(a, com, allowed):
                t = {**known, **{v: kind for v in range(a, b + 1)}}
                lo = max(b, a + D - 1) + 1
                # a segment is a maximal run: the unit after it is not recomputed
                for more in _assignments(lo, b + D + 1, allowed, t,
                                         no_rec=b + 1 if kind == REC_ else -1):
                    tt = {**t, **{v: x for v, x in zip(range(lo, b + D + 1), more) if v < n}}
                    window = tuple(tt.get(v, END_) for v in range(a - D - 1, b + D + 1))
                    if (a, b, window) not in memo:
                        dt = float(fwd[a:b + 1].sum()) if kind == REC_ else \
                            chain.offload_time(a, tt) if kind == OFF_ else 0.0
                        memo[(a, b, window)] = (*chain.transition(a, b, tt), dt)
                    local, held, dt = memo[(a, b, window)]
                    nxt = (b + 1, tuple(tt.get(v, START_) for v in range(b - D, b + 1)),
                           tuple(tt.get(v, END_) for v in range(b + 1, b + D + 1)))
                    for i, (H, T, P, _) in enumerate(front):
                        if H + local > budget * (1 + 1e-12):
                            break          # fronts are sorted by held bytes
                        H2 = H + held
                        if quantum:
                            H2 = math.ceil(H2 / quantum - 1e-9) * quantum
                        entry = (H2, T + dt, max(P, H + local), (a, b, kind, front, i))
                        (finals if b == n - 1 else fronts.setdefault(nxt, [])).append(entry)
    opt_peak = chain.opt_bytes + float(chain.tail.sum())
    finals = [f for f in finals if opt_peak <= budget]
    if not finals:
        return math.inf, math.inf, None
    _, T, P, back = min(finals, key=lambda f: (f[1], f[2]))
    types = [KEEP_] * n
    while back is not None:
        a, b, kind, front, i = back
        types[a:b + 1] = [kind] * (b + 1 - a)
        back = front[i][3]
    return T, max(P, opt_peak), types


def _assignments(lo: int, hi: int, allowed: list[list[int]], fixed: dict[int, int],
                 no_rec: int = -1) -> list[tuple[int, ...]]:
    """Every choice of policies for units ``lo … hi-1`` (END beyond the chain), those in
    ``fixed`` as given, each among its ``allowed`` ones (unit ``no_rec`` not recomputed)."""
    n = len(allowed)
    options = [[END_] if v >= n else [fixed[v]] if v in fixed else
               [x for x in allowed[v] if not (v == no_rec and x == REC_)]
               for v in range(lo, hi)]
    return [tuple(c) for c in itertools.product(*options)]


def _block_ends(a: int, com: tuple[int, ...], allowed: list[list[int]]) -> list[int]:
    """Last units of the blocks that may start at ``a`` given the committed policies ``com``
    of units ``a … a+D-1``: ``a`` itself for a kept or offloaded unit; for a segment, where
    the committed run of recomputed units ends, or anywhere after it while units may be
    recomputed."""
    if com[0] != REC_:
        return [a]
    run = next((k for k, x in enumerate(com) if x != REC_), None)
    if run is not None:
        return [a + run - 1]
    out = []
    for b in range(a + len(com) - 1, len(allowed)):
        if REC_ not in allowed[b]:
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
