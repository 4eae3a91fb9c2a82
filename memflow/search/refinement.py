"""Refinement: memflow's MCMC search started from a planner's strategy.

``refine`` runs :class:`memflow.MCMCSearch` from a strategy and reports the planner's and the
search's best side by side, judged by the same simulator against the same limit. The search
keeps the best feasible strategy it has seen, the start included, so a search started from a
plan that fits can only match or beat it (``never_worse``).

The search may choose the policies the plan uses (a compressed plan's error bounds included)
and keep / recompute / offload, except offload where the devices' hosts have no memory to
receive it (an edge board's unified memory): the search's cost counts device memory only, so
it must not be offered a move whose host side it cannot judge.

>>> from memflow.search.synthetic import chain_graph
>>> from memflow.planners import checkpoint
>>> g = chain_graph(6, width=4096, batch=16384, seed=None)
>>> s = checkpoint(g, "1xV100-16GB", "3.5GiB", method="sqrt")
>>> r = refine(g, "1xV100-16GB", s, iterations=50, memory_limit="3.5GiB")
>>> bool(r["never_worse"]), bool(r["search_time"] <= r["plan_time"])
(True, True)
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..errors import PlanError
from ..planners.common import as_cluster
from ..sim import Evaluator
from ..strategy import Strategy
from ..strategy.runnable import unrunnable
from .mcmc import MCMCSearch

__all__ = ["refine", "search_policies"]


def search_policies(cluster, strategy: Strategy) -> tuple[list[str], list[float]]:
    """The policies and error bounds the search may choose from ``strategy``: keep, recompute,
    offload (only where every host of the devices used holds memory) and the plan's own.

    >>> from memflow.search.synthetic import chain_graph
    >>> from memflow.planners import compress_strategy
    >>> g = chain_graph(3, width=512, batch=64, seed=None)
    >>> search_policies(as_cluster("jetson-nano-4GB"), compress_strategy(g, "jetson-nano-4GB"))
    (['keep', 'recompute', 'compress'], [0.01])
    """
    ca = cluster.arrays
    devs = sorted({d for group in strategy.devices for d in group})
    hosts = np.unique(ca.host[cluster.devices.index.get_indexer(devs)])
    policies = ["keep", "recompute"]
    if np.all(ca.host_memory[hosts] > 0):
        policies.append("offload")
    policies += [p for p in dict.fromkeys(strategy.policies) if p not in policies]
    bounds = sorted({float(b) for b in np.asarray(strategy.error_bound) if b == b})
    return policies, bounds or [1e-3]


def refine(graph, cluster: Any, strategy: Strategy, *, iterations: int = 300,
           seconds: float | None = None, memory_limit: Any = None, seed: int = 0,
           optimizer: str = "sgd") -> pd.Series:
    """Search from ``strategy`` for ``iterations`` steps (or ``seconds``); the plan beside the
    search's best: ``plan_time``, ``plan_peak``, ``plan_fits``, ``search_time``,
    ``search_peak``, ``search_fits``, ``speedup`` (plan time / search time), ``iterations``,
    ``never_worse``. The series' ``attrs["best"]`` is the search's best strategy."""
    if not isinstance(strategy, Strategy):
        raise PlanError(f"refine: strategy must be a memflow Strategy (what a planner returns), "
                        f"got {type(strategy).__name__}")
    c = as_cluster(cluster)
    ev = Evaluator(graph, c, memory_limit, optimizer=optimizer)
    policies, bounds = search_policies(c, strategy)
    # a plan export runs is refined within what export runs; another (a 1F1B pipeline) in the
    # full space, so that the search starts from the plan itself
    search = MCMCSearch(graph, c, memory_limit=memory_limit, init=strategy, seed=seed,
                        optimizer=optimizer, policies=policies, error_bounds=bounds,
                        runnable=unrunnable(strategy, graph) is None)
    search.run(iterations=iterations, seconds=seconds)
    before, after = ev(strategy), ev(search.best)
    never_worse = after.fits if before.fits else True
    if before.fits and after.fits:
        never_worse = after.time <= before.time * (1 + 1e-9)
    out = pd.Series({"plan_time": before.time, "plan_peak": before.peak,
                     "plan_fits": before.fits, "search_time": after.time,
                     "search_peak": after.peak, "search_fits": after.fits,
                     "speedup": before.time / after.time, "iterations": search.iteration,
                     "never_worse": never_worse}, name=strategy.name)
    out.attrs["best"] = search.best
    return out
