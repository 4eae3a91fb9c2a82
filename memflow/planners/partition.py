"""Cutting a chain of units into pipeline stages under per-stage memory: an ILP and a DP.

The model (Beaumont, Eyraud-Dubois, Shilova, "Pipelined model parallelism: complexity results
and memory considerations", Euro-Par 2021), for ``M`` micro-batches and ``P`` stages, stage
``s`` holding a contiguous run of units on its own device:

* the *period* (time per micro-batch in steady state) is the largest of the stages' forward +
  backward time per micro-batch and of the transfer time of every cut;
* stage ``s`` holds its units' persistent bytes (weights, gradients, optimizer state), the
  activations of ``k_s`` in-flight micro-batches — ``k_s = min(P − s, M)`` for 1F1B, ``M`` for
  GPipe — and the largest transient of its units.

Both solvers minimise the period subject to every stage's memory; they are exact for this
model and agree (the tests check them against enumeration). The ILP's variables are
``z[i, s] = 1`` when unit ``i`` runs on stage ``s`` or an earlier one: non-increasing in
``i`` and non-decreasing in ``s``, so stages are contiguous runs; unit ``i`` is on stage ``s``
when ``z[i, s] − z[i, s−1] = 1``, and a cut after unit ``i`` is ``Σ_s z[i, s] − z[i+1, s]``.
This cumulative form keeps the relaxation tight: HiGHS proves the optimum of a 319-unit
Inception-v3 on 4 stages in seconds, where the (unit, stage) assignment form had not within
20 s.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import sparse
from scipy.optimize import Bounds, LinearConstraint, milp

__all__ = ["Chain", "in_flight", "period", "stage_memory", "solve_milp", "solve_dp"]


@dataclass(frozen=True)
class Chain:
    """Per-unit figures of one micro-batch count, in execution order.

    ``time``: forward + backward seconds per micro-batch; ``weights``: persistent bytes;
    ``act``: bytes held per in-flight micro-batch; ``tmp``: transient bytes while it runs;
    ``cut``: seconds to send the tensors crossing a cut after unit ``i`` (``n − 1`` entries).
    """

    time: np.ndarray
    weights: np.ndarray
    act: np.ndarray
    tmp: np.ndarray
    cut: np.ndarray

    @property
    def n(self) -> int:
        return len(self.time)


def in_flight(stages: int, microbatches: int, schedule: str) -> np.ndarray:
    """Micro-batches whose activations stage ``s`` holds at once.

    >>> in_flight(4, 8, "1f1b").tolist(), in_flight(4, 2, "1f1b").tolist()
    ([4, 3, 2, 1], [2, 2, 2, 1])
    >>> in_flight(3, 5, "gpipe").tolist()
    [5, 5, 5]
    """
    if schedule == "gpipe":
        return np.full(stages, microbatches, np.int64)
    return np.minimum(stages - np.arange(stages), microbatches).astype(np.int64)


def period(chain: Chain, stage: np.ndarray) -> float:
    """The period of the partition ``stage`` (stage index per unit).

    >>> c = Chain(np.array([1., 2., 3.]), np.zeros(3), np.zeros(3), np.zeros(3),
    ...           np.array([0.5, 4.0]))
    >>> period(c, np.array([0, 0, 1])), period(c, np.array([0, 1, 1]))
    (4.0, 5.0)
    """
    stage = np.asarray(stage)
    busy = np.bincount(stage, weights=chain.time)
    cuts = chain.cut[np.diff(stage) > 0]
    return float(max(busy.max(), cuts.max(initial=0.0)))


def stage_memory(chain: Chain, stage: np.ndarray, flight: np.ndarray) -> np.ndarray:
    """Bytes per stage under the model: persistent + in-flight activations + largest transient."""
    stage = np.asarray(stage)
    P = len(flight)
    held = np.bincount(stage, weights=chain.weights, minlength=P) \
        + flight * np.bincount(stage, weights=chain.act, minlength=P)
    tmp = np.zeros(P)
    np.maximum.at(tmp, stage, chain.tmp)
    return held + tmp


def solve_milp(chain: Chain, limits: np.ndarray, flight: np.ndarray, *,
               time_limit: float = 20.0) -> tuple[np.ndarray, float] | None:
    """Stage per unit and period minimising the period under ``limits`` (bytes per stage), or
    None when HiGHS proves there is none or does not prove an optimum within ``time_limit``
    seconds (callers then use :func:`solve_dp`)."""
    n, P = chain.n, len(limits)
    if P > n:
        return None
    if P == 1:
        return solve_dp(chain, limits, flight)
    # HiGHS works to absolute tolerances: scale time and bytes to O(1) first
    t_unit = float(max(chain.time.sum(), chain.cut.max(initial=0.0), 1e-30))
    b_unit = float(max(np.max(limits), 1e-30))
    time, cut = chain.time / t_unit, chain.cut / t_unit
    weights, act, tmp = chain.weights / b_unit, chain.act / b_unit, chain.tmp / b_unit
    limits = np.asarray(limits, np.float64) / b_unit
    Q = P - 1                   # z[i, s] = 1 when unit i is on stage s or earlier (s < P - 1)
    nz = n * Q
    T, m0 = nz, nz + 1          # the period, then the largest transient of each stage
    nv = nz + 1 + P
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    lo: list[float] = []
    hi: list[float] = []

    def add(entries, lb, ub):
        for c, v in entries:
            rows.append(len(lo))
            cols.append(c)
            vals.append(v)
        lo.append(lb)
        hi.append(ub)

    def on(i: int, s: int, coef: float) -> tuple[list, float]:
        """coef · x[i, s] = coef · (z[i, s] − z[i, s−1]) as (entries, constant)."""
        entries = ([(i * Q + s, coef)] if s < Q else []) + \
                  ([(i * Q + s - 1, -coef)] if s > 0 else [])
        return entries, coef if s == Q else 0.0

    def total(coefs: np.ndarray, s: int) -> tuple[list, float]:
        entries, const = [], 0.0
        for i in range(n):
            e, c = on(i, s, float(coefs[i]))
            entries += e
            const += c
        return entries, const

    for i in range(n - 1):              # later units are on the same stage or a later one
        for s in range(Q):
            add([(i * Q + Q + s, 1.0), (i * Q + s, -1.0)], -np.inf, 0.0)
    for i in range(n):
        for s in range(1, Q):
            add([(i * Q + s - 1, 1.0), (i * Q + s, -1.0)], -np.inf, 0.0)
    for s in range(P):
        e, c = total(np.ones(n), s)
        add(e, 1.0 - c, np.inf)                                  # every stage has a unit
        e, c = total(time, s)
        add(e + [(T, -1.0)], -np.inf, -c)                        # its time is within the period
        e, c = total(weights + flight[s] * act, s)
        add(e + [(m0 + s, 1.0)], -np.inf, limits[s] - c)         # its memory within the limit
        for i in np.flatnonzero(tmp > 0):
            e, c = on(int(i), s, float(tmp[i]))
            add(e + [(m0 + s, -1.0)], -np.inf, -c)
    for i in np.flatnonzero(cut > 0):   # a cut after unit i: z[i, s] − z[i+1, s] = 1 for one s
        if i < n - 1:
            add([(i * Q + s, float(cut[i])) for s in range(Q)]
                + [((i + 1) * Q + s, -float(cut[i])) for s in range(Q)] + [(T, -1.0)],
                -np.inf, 0.0)
    A = sparse.csr_array((vals, (rows, cols)), shape=(len(lo), nv))
    lb, ub = np.zeros(nv), np.ones(nv)
    ub[T:] = np.inf
    lb[0] = 1.0                  # the first unit is on stage 0
    ub[(n - 1) * Q + Q - 1] = 0  # the last on the last stage
    cost = np.zeros(nv)
    cost[T] = 1.0
    integrality = np.zeros(nv)
    integrality[:nz] = 1
    res = milp(cost, integrality=integrality, bounds=Bounds(lb, ub),
               constraints=LinearConstraint(A, lo, hi),
               options={"time_limit": float(time_limit)})
    if res.status != 0 or res.x is None:
        return None
    stage = (Q - res.x[:nz].reshape(n, Q).round().sum(1)).astype(np.int64)
    return stage, period(chain, stage)


def solve_dp(chain: Chain, limits: np.ndarray,
             flight: np.ndarray) -> tuple[np.ndarray, float] | None:
    """The same optimum by dynamic programming over (stage, first unit of the next stage).

    >>> c = Chain(np.array([1., 1., 1., 1.]), np.zeros(4), np.ones(4), np.zeros(4), np.zeros(3))
    >>> solve_dp(c, np.array([2.0, 2.0]), np.array([1, 1]))
    (array([0, 0, 1, 1]), 2.0)
    >>> solve_dp(c, np.array([1.0, 1.0]), np.array([1, 1])) is None
    True
    """
    n, P = chain.n, len(limits)
    if P > n:
        return None
    cw = np.concatenate([[0.0], np.cumsum(chain.weights)])
    ca = np.concatenate([[0.0], np.cumsum(chain.act)])
    ct = np.concatenate([[0.0], np.cumsum(chain.time)])
    cut = np.concatenate([[0.0], chain.cut])          # cut[j]: before unit j (j >= 1)
    # run max of tmp over [i, j): tmax[i][j]
    tmax = np.zeros((n + 1, n + 1))
    for i in range(n):
        tmax[i, i + 1:] = np.maximum.accumulate(chain.tmp[i:])
    inf = np.inf
    best = np.full((P, n + 1), inf)          # best[s, j]: stages 0..s cover units [0, j)
    arg = np.zeros((P, n + 1), np.int64)
    i_all = np.arange(n + 1)
    for s in range(P):
        for j in range(s + 1, n - (P - 1 - s) + 1):
            i = i_all[s:j] if s else np.array([0])
            if not len(i):
                continue
            mem = cw[j] - cw[i] + flight[s] * (ca[j] - ca[i]) + tmax[i, j]
            val = ct[j] - ct[i]
            if s:
                val = np.maximum(np.maximum(val, best[s - 1, i]), cut[i])
            val = np.where(mem <= limits[s], val, inf)
            k = int(np.argmin(val))
            best[s, j], arg[s, j] = val[k], i[k]
    if not np.isfinite(best[P - 1, n]):
        return None
    stage = np.empty(n, np.int64)
    j = n
    for s in range(P - 1, -1, -1):
        i = arg[s, j]
        stage[i:j] = s
        j = i
    return stage, period(chain, stage)
