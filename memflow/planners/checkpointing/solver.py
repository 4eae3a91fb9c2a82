"""The dynamic program of optimal checkpointing: a table over segmentations of the chain.

A schedule cuts the chain into *blocks* — a kept or offloaded unit, or a maximal run of
recomputed units (a segment) — and :func:`solve` finds the blocks of least time whose peak fits
the budget, as rotor does for chains (Beaumont et al., "Optimal checkpointing for heterogeneous
chains"), with these differences:

* the table: a block's memory depends on the policies of the ``D`` units on each side of it
  (the chain's span, :mod:`.chain`), so a state is (first unit of the next block, the policies
  of the ``D+1`` units before it, the committed policies of it and the ``D-1`` after). Each
  transition asks the chain for the block's local peak and the bytes it leaves held
  (:meth:`~.chain.ChainMemory.transition`, memoized by its window of policies);
* memory is not discretized: each state keeps the Pareto front of (bytes held for backward,
  time), so the optimum is exact; ``slots=S`` rounds the held bytes up to multiples of
  ``budget / S`` as rotor does, which bounds the work and can only lose schedules, never return
  one that does not fit;
* reconstruction: each front entry points back at the entry it extends, so the winning final
  entry unwinds into a policy per unit (:func:`_reconstruct`).

>>> _pareto([(2.0, 1.0, 0.0, None), (1.0, 3.0, 0.0, None), (3.0, 2.0, 0.0, None)])
[(1.0, 3.0, 0.0, None), (2.0, 1.0, 0.0, None)]
"""
from __future__ import annotations

import itertools
import math

import numpy as np

from .chain import END_, KEEP_, OFF_, REC_, START_, ChainMemory

__all__ = ["solve"]


def solve(chain: ChainMemory, fwd: np.ndarray, allowed: list[list[int]], budget: float,
          slots: int | None = None, least: str = "time"
          ) -> tuple[float, float, list[int] | None]:
    """The DP: (extra time, peak above the persistent bytes, policy per unit) of the fastest
    schedule within ``budget`` (``least="memory"``: of one of least peak); ``None`` policies
    when nothing fits.

    ``fwd`` is each unit's forward time (what recomputing it adds), ``allowed`` each unit's
    policy codes, ``budget`` the bytes above the persistent ones. States are (first unit of the
    next block, policies of the ``D+1`` units before it, the committed policies of it and the
    ``D-1`` after); each keeps a Pareto front of (held bytes, time, peak so far, back pointer),
    front over held bytes and time, or over held bytes and peak for ``least="memory"`` (what
    is still to come depends on the held bytes only, so the least peak is exact; its time is
    not the least at that peak: solve again with that peak as the budget).

    >>> import math, memflow
    >>> from memflow.search.synthetic import chain_graph
    >>> from memflow.planners.checkpointing.chain import KEEP_, REC_, forward_times, span
    >>> g = chain_graph(4, batch=16384, width=64)
    >>> base = memflow.Strategy.single_device(g)
    >>> sim = memflow.sim.Simulator(g, memflow.Cluster.preset("1xV100-16GB"))
    >>> chain = ChainMemory(sim, base, span(sim.ga)[0])
    >>> fwd, allowed = forward_times(sim.run(base), 4), [[KEEP_, REC_]] * 4
    >>> solve(chain, fwd, allowed, math.inf)           # room for everything: keep all
    (0.0, 62507840.0, [0, 0, 0, 0])
    >>> T, P, types = solve(chain, fwd, allowed, 55e6)   # recompute the first unit
    >>> bool(T == fwd[0]), P, types
    (True, 51497792.0, [1, 0, 0, 0])
    >>> solve(chain, fwd, allowed, 50e6)[2] is None      # below every schedule
    True
    >>> solve(chain, fwd, allowed, math.inf, least="memory")[1:]   # the least peak there is
    (51497792.0, [1, 0, 0, 0])
    """
    n, D = chain.n, chain.D
    by = {"time": 1, "memory": 2}[least]
    quantum = budget / slots if slots else 0.0
    fronts: dict[tuple, list] = {}
    for com in _assignments(0, D, allowed, {}):
        fronts[(0, (START_,) * (D + 1), com)] = [(0.0, 0.0, 0.0, None)]
    memo: dict[tuple, tuple[float, float, float]] = {}
    finals = []
    for a in range(n):
        for key in sorted(k for k in fronts if k[0] == a):
            _, hist, com = key
            front = _pareto(fronts.pop(key), by)
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
                        entry = (_round_up(H + held, quantum), T + dt, max(P, H + local),
                                 (a, b, kind, front, i))
                        (finals if b == n - 1 else fronts.setdefault(nxt, [])).append(entry)
    opt_peak = chain.opt_bytes + float(chain.tail.sum())
    finals = [f for f in finals if opt_peak <= budget]
    if not finals:
        return math.inf, math.inf, None
    _, T, P, back = min(finals, key=lambda f: (f[by], f[3 - by]))
    return T, max(P, opt_peak), _reconstruct(back, n)


def _round_up(held: float, quantum: float) -> float:
    """``held`` bytes rounded up to a multiple of ``quantum`` (rotor's memory slots; none
    when ``quantum`` is 0).

    >>> _round_up(5.0, 2.0), _round_up(4.0, 2.0), _round_up(5.0, 0.0)
    (6.0, 4.0, 5.0)
    """
    return math.ceil(held / quantum - 1e-9) * quantum if quantum else held


def _reconstruct(back: tuple | None, n: int) -> list[int]:
    """The policy per unit of a schedule, unwound from the back pointer of its final entry:
    each pointer is (first unit, last unit, policy, front, index of the entry it extends).

    >>> first = [(0.0, 0.0, 0.0, None)]
    >>> second = [(1.0, 0.0, 0.0, (0, 1, REC_, first, 0))]
    >>> _reconstruct((2, 2, KEEP_, second, 0), 3) == [REC_, REC_, KEEP_]
    True
    """
    types = [KEEP_] * n
    while back is not None:
        a, b, kind, front, i = back
        types[a:b + 1] = [kind] * (b + 1 - a)
        back = front[i][3]
    return types


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
