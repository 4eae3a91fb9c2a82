"""The dynamic program of optimal checkpointing: a table over segmentations of the chain.

A schedule cuts the chain into *blocks* — a kept or offloaded unit, or a maximal run of
recomputed units (a segment) — and :func:`solve` finds the blocks of least time whose peak fits
the budget, as rotor does for chains (Beaumont et al., "Optimal checkpointing for heterogeneous
chains"), with these differences:

* the table: a block's memory depends on the policies of the ``D`` units on each side of it
  (the chain's span, :mod:`.chain`), so a state is (first unit of the next block, the policies
  of the ``D+1`` units before it, the committed policies of it and the ``D-1`` after). Which
  states and blocks exist does not depend on memory, so :func:`_table` lists every transition
  first and asks the chain for all their local peaks and held bytes in one compiled call
  (:meth:`~.chain.ChainMemory.transitions`);
* memory, two ways. Exact (``slots=None``): each state keeps the Pareto front of (bytes held
  for backward, time), so the optimum is exact, but the fronts grow with the chain (0.1 s of
  CPU at 36 units, 11 s at 100). Memory slots (``slots=S``), after rotor: the held bytes are
  cut into ``S`` slots of ``budget / S`` and each state keeps one entry per slot, the best
  (time, then peak), in a compiled loop (:func:`_slot_table`). Unlike rotor, an entry keeps
  its exact held bytes instead of rounding them up, so every fit is checked exactly (a
  schedule returned always fits) and rounding errors do not pile up along the chain. The
  bound is rotor's all the same — following the optimum of the budget lowered by ``n``
  slots, each block can lose at most one slot to an entry kept in its place, so the result is
  never slower than that optimum, and never faster than the exact one — but in practice it is
  far closer: on 100 units at 500 slots, 0.08% above the exact optimum where rounding up
  costs 9.8%. A 100-unit chain solves in about 0.3 s of CPU at 500 slots;
* reconstruction: each entry points back at the transition that made it (and the slot it
  came from), so the winning final entry unwinds into a policy per unit, and the time and
  peak returned are recomputed along that schedule.

>>> _pareto([(2.0, 1.0, 0.0, None), (1.0, 3.0, 0.0, None), (3.0, 2.0, 0.0, None)])
[(1.0, 3.0, 0.0, None), (2.0, 1.0, 0.0, None)]
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from ...memory.jit import njit
from .chain import END_, KEEP_, OFF_, REC_, START_, ChainMemory

__all__ = ["solve"]


@dataclass(frozen=True)
class _Table:
    """Every transition of the DP, in an order where a state's incoming transitions all come
    before its outgoing ones: source and target state (-1: the schedule ends), block, policy,
    added time, local peak and newly held bytes."""

    n_states: int
    initial: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    a: np.ndarray
    b: np.ndarray
    kind: np.ndarray
    dt: np.ndarray
    local: np.ndarray
    held: np.ndarray


def solve(chain: ChainMemory, fwd: np.ndarray, allowed: list[list[int]], budget: float,
          slots: int | None = None, least: str = "time"
          ) -> tuple[float, float, list[int] | None]:
    """The DP: (extra time, peak above the persistent bytes, policy per unit) of the fastest
    schedule within ``budget`` (``least="memory"``: of one of least peak); ``None`` policies
    when nothing fits.

    ``fwd`` is each unit's forward time (what recomputing it adds), ``allowed`` each unit's
    policy codes, ``budget`` the bytes above the persistent ones. Exact, each state keeps a
    Pareto front of (held bytes, time, peak so far, back pointer), front over held bytes and
    time, or over held bytes and peak for ``least="memory"`` (what is still to come depends on
    the held bytes only, so the least peak is exact; its time is not the least at that peak:
    solve again with that peak as the budget). With ``slots``, each state keeps the best entry
    per slot of ``budget / slots`` held bytes (for ``least="memory"``, ``1 / slots`` of the
    most any schedule can hold).

    >>> import math, memflow
    >>> from memflow.search.synthetic import chain_graph
    >>> from memflow.planners.checkpointing.chain import KEEP_, REC_, forward_times, span
    >>> g = chain_graph(4, batch=16384, width=64)
    >>> base = memflow.Strategy.single_device(g)
    >>> sim = memflow.sim.Simulator(g, memflow.Cluster.preset("1xV100-16GB"))
    >>> chain = ChainMemory(sim, base, span(sim.ga)[0])
    >>> fwd, allowed = forward_times(sim.run(base), 4), [[KEEP_, REC_]] * 4
    >>> solve(chain, fwd, allowed, math.inf)           # room for everything: keep all
    (0.0, 53483648.0, [0, 0, 0, 0])
    >>> T, P, types = solve(chain, fwd, allowed, 45e6)   # recompute the first unit
    >>> bool(T == fwd[0]), P, types
    (True, 42473600.0, [1, 0, 0, 0])
    >>> solve(chain, fwd, allowed, 45e6, slots=500) == (T, P, types)
    True
    >>> solve(chain, fwd, allowed, 40e6)[2] is None      # below every schedule
    True
    >>> solve(chain, fwd, allowed, math.inf, least="memory")[1:]   # the least peak there is
    (41425024.0, [1, 0, 1, 0])
    """
    by_memory = {"time": False, "memory": True}[least]
    table = _table(chain, fwd, allowed)
    opt_peak = chain.opt_bytes + float(chain.tail.sum())
    if opt_peak > budget:
        return math.inf, math.inf, None
    if slots:
        path = _slot_path(table, budget, slots, by_memory, chain.most_held)
    else:
        path = _front_path(table, budget, 2 if by_memory else 1)
    if path is None:
        return math.inf, math.inf, None
    types, H, T, P = [KEEP_] * chain.n, 0.0, 0.0, 0.0
    for t in path:       # the schedule's own time and peak, unrounded
        types[table.a[t]:table.b[t] + 1] = [int(table.kind[t])] * int(table.b[t] + 1 - table.a[t])
        T, P, H = T + table.dt[t], max(P, H + table.local[t]), H + table.held[t]
    return float(T), max(float(P), opt_peak), types


def _table(chain: ChainMemory, fwd: np.ndarray, allowed: list[list[int]]) -> _Table:
    """Every state reachable from the start and every block from each, with its numbers."""
    n, D = chain.n, chain.D
    index: dict[tuple, int] = {}
    by_start: list[list[tuple]] = [[] for _ in range(n)]

    def state(key: tuple) -> int:
        if key not in index:
            index[key] = len(index)
            by_start[key[0]].append(key)
        return index[key]

    initial = [state((0, (START_,) * (D + 1), com)) for com in _assignments(0, D, allowed)]
    rows, hists, afters = [], [], []
    choices: dict[tuple, list] = {}
    ends = np.concatenate([[0.0], np.cumsum(fwd)])
    for a in range(n):
        for key in sorted(by_start[a]):
            _, hist, com = key
            kind = com[0]
            for b in _block_ends(a, com, allowed):
                lo = max(b, a + D - 1) + 1
                # a segment is a maximal run: the unit after it is not recomputed
                which = (lo, b + D + 1, b + 1 if kind == REC_ else -1)
                if which not in choices:
                    choices[which] = _assignments(*which[:2], allowed, no_rec=which[2])
                for more in choices[which]:
                    after = com[b + 1 - a:] + more
                    before = tuple(hist[v - a + D + 1] if v < a else kind
                                   for v in range(b - D, b + 1))
                    dst = state((b + 1, before, after)) if b + 1 < n else -1
                    dt = ends[b + 1] - ends[a] if kind == REC_ else \
                        chain.offload_time(a, {a - 1: hist[-1], a: kind,
                                               **dict(zip(range(a + 1, a + D + 1), after))}) \
                        if kind == OFF_ else 0.0
                    rows.append((index[key], dst, a, b, kind, dt))
                    hists.append(hist)
                    afters.append(after)
    src, dst, a_, b_, kind_, dt = (np.array(c) for c in zip(*rows))
    local, held = chain.transitions(a_, b_, np.array(hists), kind_, np.array(afters))
    return _Table(len(index), np.array(initial, np.int64), src.astype(np.int64),
                  dst.astype(np.int64), a_, b_, kind_, dt.astype(np.float64), local, held)


def _front_path(table: _Table, budget: float, by: int) -> list[int] | None:
    """Exact: Pareto fronts per state; the transitions of the best schedule, or None."""
    fronts: dict[int, list] = {s: [(0.0, 0.0, 0.0, None)] for s in table.initial}
    finals = []
    current, front = -1, []
    for t in range(len(table.src)):
        if table.src[t] != current:
            current = int(table.src[t])
            front = _pareto(fronts.pop(current, []), by)
        local, held, dt, d = table.local[t], table.held[t], table.dt[t], int(table.dst[t])
        for i, (H, T, P, _) in enumerate(front):
            if H + local > budget * (1 + 1e-12):
                break          # fronts are sorted by held bytes
            entry = (H + held, T + dt, max(P, H + local), (t, front, i))
            (finals if d < 0 else fronts.setdefault(d, [])).append(entry)
    if not finals:
        return None
    back = min(finals, key=lambda f: (f[by], f[3 - by]))[3]
    path = []
    while back is not None:
        t, front, i = back
        path.append(t)
        back = front[i][3]
    return path[::-1]


def _slot_path(table: _Table, budget: float, slots: int, by_memory: bool,
               most: float) -> list[int] | None:
    """Memory slots of ``budget / slots`` bytes (``most / slots`` without a budget): each
    state keeps its best entry per slot of held bytes; the transitions of the best schedule,
    or None."""
    quantum = (budget if math.isfinite(budget) else most) / slots
    if not quantum > 0:
        quantum = 1.0
    width = slots + 2
    ptr, came, final_t, final_h = _slot_table(
        table.n_states, table.initial, table.src, table.dst, table.local, table.held,
        table.dt, budget, quantum, width, by_memory)
    if final_t < 0:
        return None
    path, t, h = [], final_t, final_h
    while t >= 0:
        path.append(t)
        s = table.src[t]
        t, h = ptr[s, h], came[s, h]
    return path[::-1]


@njit
def _slot_table(n_states, initial, src, dst, local, held, dt, budget, quantum, width,
                by_memory):
    # per state and slot of held bytes, the best entry: (first, second) = (time, peak) or
    # (peak, time), its exact held bytes, the transition that made it and the slot it came
    # from; then the best final transition and the slot it left from
    first = np.full((n_states, width), np.inf)
    second = np.full((n_states, width), np.inf)
    hold = np.full((n_states, width), np.inf)
    ptr = np.full((n_states, width), -1, np.int64)
    came = np.full((n_states, width), -1, np.int64)
    for s in initial:
        first[s, 0], second[s, 0], hold[s, 0] = 0.0, 0.0, 0.0
    best = (np.inf, np.inf)
    final_t, final_h = -1, -1
    limit = budget * (1 + 1e-12)
    for t in range(len(src)):
        s, d = src[t], dst[t]
        for h in range(width):
            if h * quantum + local[t] > limit:
                break          # every entry of a later slot holds more
            H = hold[s, h]
            if H == np.inf or H + local[t] > limit:
                continue        # an empty slot, or one whose entry does not fit
            time = (second[s, h] if by_memory else first[s, h]) + dt[t]
            peak = max(first[s, h] if by_memory else second[s, h], H + local[t])
            new = (peak, time) if by_memory else (time, peak)
            if d < 0:
                if new < best:
                    best, final_t, final_h = new, t, h
                continue
            g = min(int((H + held[t]) / quantum), width - 1)
            if (new[0], new[1], H + held[t]) < (first[d, g], second[d, g], hold[d, g]):
                first[d, g], second[d, g], hold[d, g] = new[0], new[1], H + held[t]
                ptr[d, g], came[d, g] = t, h
    return ptr, came, final_t, final_h


def _assignments(lo: int, hi: int, allowed: list[list[int]],
                 no_rec: int = -1) -> list[tuple[int, ...]]:
    """Every choice of policies for units ``lo … hi-1`` (END beyond the chain), each among its
    ``allowed`` ones (unit ``no_rec`` not recomputed).

    >>> _assignments(1, 3, [[0, 1], [0, 1], [0]], no_rec=1)
    [(0, 0)]
    """
    n = len(allowed)
    options = [(END_,) if v >= n else
               tuple(x for x in allowed[v] if not (v == no_rec and x == REC_))
               for v in range(lo, hi)]
    return list(itertools.product(*options))


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


def _pareto(entries: list, by: int = 1) -> list:
    """Entries not beaten in both held bytes and entry ``by`` (1: time, 2: peak so far),
    sorted by held bytes."""
    out = []
    best = math.inf
    for e in sorted(entries, key=lambda e: (e[0], e[by], e[3 - by])):
        if e[by] < best:
            out.append(e)
            best = e[by]
    return out
