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
``x[i, s]`` (unit ``i`` on stage ``s``); the stage index ``Σ_s s·x[i, s]`` starts at 0, ends
at ``P − 1`` and grows by 0 or 1 from one unit to the next, so every stage is a non-empty
contiguous run, and a cut after unit ``i`` is that growth.
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
    None when HiGHS proves there is none or finds none within ``time_limit`` seconds."""
    n, P = chain.n, len(limits)
    if P > n:
        return None
    # HiGHS works to absolute tolerances: scale time and bytes to O(1) first
    t_unit = float(max(chain.time.sum(), chain.cut.max(initial=0.0), 1e-30))
    b_unit = float(max(np.max(limits), 1e-30))
    chain = Chain(chain.time / t_unit, chain.weights / b_unit, chain.act / b_unit,
                  chain.tmp / b_unit, chain.cut / t_unit)
    limits = np.asarray(limits, np.float64) / b_unit
    nx = n * P
    T, m0 = nx, nx + 1                  # the period, then one transient variable per stage
    nv = nx + 1 + P

    def xi(i, s):
        return i * P + s

    rows, cols, vals, lo, hi = [], [], [], [], []
    r = 0

    def add(entries, lb, ub):
        nonlocal r
        for c, v in entries:
            rows.append(r)
            cols.append(c)
            vals.append(v)
        lo.append(lb)
        hi.append(ub)
        r += 1

    for i in range(n):
        add([(xi(i, s), 1.0) for s in range(P)], 1.0, 1.0)
    for i in range(n - 1):              # stage grows by 0 or 1; a growth is a cut
        step = [(xi(i + 1, s), float(s)) for s in range(1, P)] + \
               [(xi(i, s), -float(s)) for s in range(1, P)]
        add(step, 0.0, 1.0)
        if chain.cut[i] > 0:
            add(step + [(T, -1.0 / chain.cut[i])], -np.inf, 0.0)
    for s in range(P):
        add([(xi(i, s), float(chain.time[i])) for i in range(n)] + [(T, -1.0)], -np.inf, 0.0)
        add([(xi(i, s), float(chain.weights[i] + flight[s] * chain.act[i])) for i in range(n)]
            + [(m0 + s, 1.0)], -np.inf, float(limits[s]))
        for i in range(n):
            if chain.tmp[i] > 0:
                add([(xi(i, s), float(chain.tmp[i])), (m0 + s, -1.0)], -np.inf, 0.0)
    A = sparse.csr_array((vals, (rows, cols)), shape=(r, nv))
    lb, ub = np.zeros(nv), np.ones(nv)
    ub[T:] = np.inf
    lb[xi(0, 0)] = ub[xi(0, 0)] = 1.0
    lb[xi(n - 1, P - 1)] = ub[xi(n - 1, P - 1)] = 1.0
    cost = np.zeros(nv)
    cost[T] = 1.0
    integrality = np.zeros(nv)
    integrality[:nx] = 1
    res = milp(cost, integrality=integrality, bounds=Bounds(lb, ub),
               constraints=LinearConstraint(A, lo, hi),
               options={"time_limit": float(time_limit)})
    if res.x is None:
        return None
    stage = res.x[:nx].reshape(n, P).argmax(1)
    return stage, period(chain, stage) * t_unit


def solve_dp(chain: Chain, limits: np.ndarray, flight: np.ndarray) -> tuple[np.ndarray, float] | None:
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
