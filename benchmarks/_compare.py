"""What the benchmarks that set memflow's search against planners share.

* :func:`no_worse` — the order a search's best is judged in against its start: feasible before
  infeasible, then a lower cost (the chain reports a feasible best only once it has seen one,
  and never a worse one);
* :func:`flexflow` — FlexFlow's search (SysML 2019) as memflow runs it: the same Metropolis
  chain with a cost that ignores memory and moves over parallel configurations only, its best
  by time whatever its memory (the caller judges it against the limits).
"""
from __future__ import annotations

from typing import Any

from memflow.search import MCMCSearch


def no_worse(start, end) -> bool:
    """True when score ``end`` is no worse than score ``start`` (feasible first, then cost)."""
    return (not end.feasible, end.cost) <= (not start.feasible, start.cost)


def flexflow(graph, cluster, seconds: float, **options: Any) -> MCMCSearch:
    """FlexFlow's memory-oblivious search from data parallelism, run for ``seconds``;
    ``options`` go to :class:`MCMCSearch` (``optimizer``, ``precision``, ``runnable`` …)."""
    return MCMCSearch(graph, cluster, memory_aware=False, seed=0, **options).run(seconds=seconds)
