"""Which units keep what they save and which recompute selectively, under a budget of bytes
held for backward: an integer program over the storages capture records (HiGHS via
``scipy.optimize.milp``).

On a graph of leaf units (a unit is one module: a Linear, a GELU, a LayerNorm…) the choice is
per operation: a ``selective`` unit keeps the outputs of its expensive ops and recomputes the
rest, and consecutive selective units form one checkpoint whose inputs it holds. Variables:
``s[u]`` (unit ``u`` selective) and ``h[x]`` (storage ``x`` held), with, as the memory model
holds them,

* a storage a kept unit saves is held: ``h[x] >= 1 - s[w]`` for each saver ``w``;
* an expensive op's output in a selective unit is held: ``h[x] >= s[p]``;
* a storage a selective unit uses from before its checkpoint is held: ``h[x] >= s[u] - s[v]``
  for each unit ``v`` from its producer up to ``u`` (any kept one between them starts
  another checkpoint; the model's inputs always come from before);
* ``sum(bytes[x] h[x]) + sum(cached[u] s[u]) <= budget`` (``cached``: expensive outputs used
  only inside the unit).

It minimises the forward FLOPs of the cheap ops the selective units re-run. The strategy it
returns is a plain :class:`~memflow.Strategy` (``keep``/``selective`` per unit; JSON as
any), exported through the same selective checkpoint policy.

>>> import memflow, torch
>>> from torch import nn
>>> block = lambda: nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.LayerNorm(64))
>>> g = memflow.from_torch(nn.Sequential(block(), block(), block()), torch.randn(8, 64))
>>> s = selective_plan(g, 0.6)
>>> sorted(set(s.policies))
['keep', 'selective']

(A Linear + ReLU stack gains nothing: ReLU saves its output, a selective Linear its own.)
"""
from __future__ import annotations

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from ..graph.units import LOSS
from ..memory.arrays import graph_arrays
from ..strategy import Strategy
from .common import Infeasible

__all__ = ["selective_plan"]


def _rows(ga) -> tuple[list[tuple[dict[int, float], float]], np.ndarray]:
    """The ``>=`` constraints ``sum(coef · var) >= lower`` over ``[s (n), h (tensors)]``."""
    n = ga.n
    rows: list[tuple[dict[int, float], float]] = []
    for x in range(len(ga.bytes)):
        h = n + x
        p = int(ga.producer[x])
        for w in ga.savers[x]:
            rows.append(({h: 1.0, w: 1.0}, 1.0))
        if p >= 0 and ga.expensive[x]:
            rows.append(({h: 1.0, p: -1.0}, 0.0))
        for u in sorted(set(ga.readers[x]) | set(ga.savers[x])):
            if u == p:
                continue
            if p < 0:
                rows.append(({h: 1.0, u: -1.0}, 0.0))
            for v in range(max(p, 0), u):
                rows.append(({h: 1.0, u: -1.0, v: 1.0}, 0.0))
    return rows, np.asarray(ga.bytes, np.float64)


def selective_plan(graph, budget: float, *, device: str = "gpu0",
                   node_limit: int | None = None) -> Strategy:
    """The keep/selective strategy of least recomputation holding at most ``budget`` bytes
    for backward (a number <= 1: that fraction of what keeping everything holds).

    ``node_limit`` stops HiGHS's branch and bound after that many nodes with the best plan
    found so far (within 1% of the optimum, or not proven): the search's per-op move solves
    with one, since an exact solve on a graph of leaf units can take half a minute; a node
    count, unlike a time limit, gives the same plan on every machine.

    Raises :class:`~memflow.planners.Infeasible` when even selective everywhere holds more.
    """
    ga = graph_arrays(graph)
    n, T = ga.n, len(ga.bytes)
    keep_all = float(graph.units["saved_bytes"].sum())
    limit = budget * keep_all if budget <= 1 else float(budget)
    rows, nbytes = _rows(ga)
    r, c, v = [], [], []
    for i, (coef, _) in enumerate(rows):
        for j, a in coef.items():
            r.append(i), c.append(j), v.append(a)
    lower = np.array([lo for _, lo in rows])
    A = coo_matrix((v, (r, c)), shape=(len(rows), n + T))
    held = np.concatenate([ga.cached, nbytes])
    cheap = ga.fwd_flops - ga.expensive_fwd_flops
    fixed = ~ga.recomputable | np.array([name == LOSS for name in ga.names])
    cost = np.concatenate([cheap / max(cheap.sum(), 1.0), 1e-9 * nbytes / max(keep_all, 1.0)])
    res = milp(cost, integrality=np.concatenate([np.ones(n), np.zeros(T)]),
               bounds=Bounds(0, np.concatenate([np.where(fixed, 0, 1), np.ones(T)])),
               constraints=[LinearConstraint(A, lower, np.inf),
                            LinearConstraint(held[None, :], 0, limit)],
               options={"time_limit": 60.0} if node_limit is None else
               {"time_limit": 60.0, "node_limit": int(node_limit), "mip_rel_gap": 0.01})
    if res.x is None:
        raise Infeasible("selective_plan", "ilp", limit=limit, min_memory=float("nan"),
                         detail="no mix of keep and selective holds less")
    selective = res.x[:n] > 0.5
    plain = Strategy(graph.names, devices=[(device,)] * n, name="selective plan")
    return plain.with_policy({u: "selective" for u, on in zip(graph.names, selective) if on})

