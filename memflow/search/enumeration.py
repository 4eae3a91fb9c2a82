"""Exhaustive enumeration: every memory-policy assignment of a small space, simulated.

The ground truth the search and the dynamic program are measured against. Each assignment is
run through the simulator (not a model of it), so the optimum is the simulator's optimum. The
space is the product of the policies over the units varied; when it has more than
``max_strategies`` members the call refuses, saying how big it is and how to shrink it.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd

from ..errors import SearchError
from ..sim import Simulator
from ..strategy import POLICIES, Strategy, parse_policy
from .cost import CostModel
from .space import policy_label

__all__ = ["exhaustive", "ExhaustiveResult"]


@dataclass(frozen=True)
class ExhaustiveResult:
    """The best assignment and the table of every one (``units`` varied, time, peak, feasible)."""

    strategy: Strategy
    time: float
    peak: float
    feasible: bool
    evaluated: int
    table: pd.DataFrame


def exhaustive(graph, cluster, *, base: Strategy | None = None,
               policies: Sequence[str] = ("keep", "recompute"),
               units: Iterable[str] | None = None, memory_limit: Any = None,
               optimizer: str = "sgd", precision: str | None = None,
               max_strategies: int = 1 << 15) -> ExhaustiveResult:
    """Simulate every assignment of ``policies`` to ``units`` (default all) on top of ``base``
    (default: everything on the cluster's first device) and return the fastest that fits
    ``memory_limit`` (default: capacity). When none fits, the least-cost one is returned with
    ``feasible=False``. ``policies`` may include ``"compress:<bound>"`` entries.

    >>> import memflow
    >>> from memflow.search.synthetic import chain_graph
    >>> g = chain_graph(4, batch=4096, width=256)
    >>> res = exhaustive(g, memflow.Cluster.preset("1xV100-16GB"), memory_limit=50e6)
    >>> res.evaluated, res.feasible, res.strategy.policies
    (16, True, ['recompute', 'keep', 'keep', 'keep'])
    >>> exhaustive(chain_graph(20), memflow.Cluster.preset("1xV100-16GB"))
    Traceback (most recent call last):
    ...
    memflow.errors.SearchError: exhaustive: 2^20 = 1,048,576 assignments exceed max_strategies=32,768; vary fewer units (units=[...]) or fewer policies, or raise max_strategies
    """
    if base is None:
        base = Strategy.single_device(graph, str(cluster.devices.index[0]))
    base.validate(graph, cluster)
    names = list(graph.names) if units is None else list(units)
    pos = {u: i for i, u in enumerate(graph.names)}
    unknown = [u for u in names if u not in pos]
    if unknown:
        raise SearchError(f"exhaustive: {unknown[0]!r} is not a unit of the graph")
    labels = [policy_label(*parse_policy("", p)) for p in policies]
    sim = Simulator(graph, cluster, optimizer=optimizer, precision=precision)
    rec_ok = sim.ga.recomputable
    choices = [[lab for lab in labels
                if rec_ok[pos[u]] or parse_policy(u, lab)[0] not in POLICIES.codes("recompute")] for u in names]
    size = math.prod(len(c) for c in choices)
    if size > max_strategies:
        shape = f"{len(labels)}^{len(names)}" if all(len(c) == len(labels) for c in choices) \
            else "the product of the choices"
        raise SearchError(f"exhaustive: {shape} = {size:,} assignments exceed max_strategies="
                          f"{max_strategies:,}; vary fewer units (units=[...]) or fewer "
                          "policies, or raise max_strategies")
    cost = CostModel(sim, memory_limit=memory_limit)
    rows, best = [], None
    for combo in itertools.product(*choices):
        s = base.with_policy(dict(zip(names, combo)))
        sc = cost(s)
        rows.append((*combo, sc.time, float(np.max(sc.peak)), sc.feasible, sc.cost))
        key = (not sc.feasible, sc.cost)
        if best is None or key < best[0]:
            best = (key, s, sc)
    table = pd.DataFrame(rows, columns=[*names, "time", "peak", "feasible", "cost"])
    _, s, sc = best
    return ExhaustiveResult(s, sc.time, float(np.max(sc.peak)), sc.feasible, len(rows), table)
