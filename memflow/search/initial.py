"""Where a chain starts: data parallelism, the best of the known baselines, or a given strategy.

The baselines are the seeds' techniques as plain strategies: data parallelism (keep
everything; recompute everything, each unit its own checkpoint segment as in Chen et al.'s and
Checkmate's "checkpoint every layer" baseline, so each unit's input is kept and the unit re-run
alone just before its backward; or the optimal checkpointing schedule of one replica),
hybrid data × model parallelism (Pal et al.) and the planners of :mod:`memflow.planners`. A
chain started from the best of them can only improve on all of them.
"""
from __future__ import annotations

from typing import Any, Callable

from ..errors import MemflowError, SearchError
from ..strategy import Strategy
from .cost import CostModel

__all__ = ["data_parallel", "baselines", "best_baseline", "INITS"]

INITS = ("data_parallel", "baseline")


def data_parallel(graph, cluster) -> Strategy:
    """Every unit replicated on as many devices as the batch allows (a divisor of both the
    device count and the batch: replicas get equal shards).

    >>> import memflow
    >>> from memflow.search.synthetic import chain_graph
    >>> data_parallel(chain_graph(2, batch=2), memflow.Cluster.preset("4xV100-16GB")).devices
    (('gpu0', 'gpu1'), ('gpu0', 'gpu1'))
    """
    devices = [str(d) for d in cluster.devices.index]
    batch = int(graph.meta.get("batch_size") or len(devices))
    k = max(d for d in range(1, len(devices) + 1) if len(devices) % d == 0 and batch % d == 0)
    return Strategy.data_parallel(graph, devices[:k])


def _hybrids(graph, cluster) -> dict[str, Strategy]:
    devices = [str(d) for d in cluster.devices.index]
    out = {}
    for mp in (2, 4, 8):
        if len(devices) % mp == 0 and mp <= len(graph):
            dp = len(devices) // mp
            try:
                s = Strategy.hybrid(graph, devices, dp=dp, mp=mp).validate(graph, cluster)
            except MemflowError:
                continue    # e.g. the batch does not split dp ways
            out[s.name] = s
    return out


def _checkpointed(graph, cluster, base: Strategy, memory_limit: Any) -> dict[str, Strategy]:
    from ..planners.checkpointing import optimal_checkpointing   # heavier; load when needed
    try:
        res = optimal_checkpointing(graph, cluster, memory_limit, base=base)
    except SearchError:
        return {}       # not a chain, or no schedule fits: nothing to offer
    return {res.strategy.name: res.strategy}


def _planned(graph, cluster, dp: Strategy, memory_limit: Any) -> dict[str, Strategy]:
    """Strategies of :mod:`memflow.planners`'s planners: offload on data parallelism, a
    pipeline, and √n checkpointing on one device. A planner that finds nothing within the limit
    still offers the least-memory strategy it built."""
    from .. import planners     # heavier (torch, scipy's solvers); load when needed
    calls = {
        "data parallel, offload (vDNN dynamic)": lambda: planners.offload(
            graph, cluster, "dynamic", memory_limit=memory_limit, base=dp),
        "pipeline": lambda: planners.pipeline(graph, cluster, memory_limit=memory_limit,
                                              solver="dp"),
        "one device, sqrt checkpointing": lambda: planners.checkpoint(
            graph, cluster, memory_limit, method="sqrt"),
    }
    out: dict[str, Strategy] = {}
    for name, call in calls.items():
        try:
            s = call()
        except MemflowError as exc:
            s = getattr(exc, "best", None)     # planners.Infeasible carries its least-memory try
        if isinstance(s, Strategy):
            out[name] = s.with_schedule(name=name)
    return out


def baselines(graph, cluster, *, memory_limit: Any = None) -> dict[str, Strategy]:
    """Candidate starting strategies by name (each valid for ``graph`` on ``cluster``).

    >>> import memflow
    >>> from memflow.search.synthetic import chain_graph
    >>> found = baselines(chain_graph(4, batch=8), memflow.Cluster.preset("4xV100-16GB"))
    >>> sorted(found)[:4]
    ['data parallel', 'data parallel, offload (vDNN dynamic)', 'data parallel, optimal checkpointing', 'data parallel, recompute everything']
    >>> found["data parallel, recompute everything"].segment.tolist()   # one segment per unit
    [0, 1, 2, 3]
    """
    dp = data_parallel(graph, cluster)
    name = "data parallel, recompute everything"
    out = {dp.name: dp,
           name: dp.with_policy(recompute=list(graph.names)).with_segments("each")
           .with_schedule(name=name)}
    out.update(_hybrids(graph, cluster))
    out.update(_checkpointed(graph, cluster, dp, memory_limit))
    out.update(_planned(graph, cluster, dp, memory_limit))
    return out


def best_baseline(graph, cluster, cost: CostModel, *, memory_limit: Any = None,
                  pin: Callable[[Strategy], Strategy] = lambda s: s,
                  admits: Callable[[Strategy], bool] = lambda s: True) -> Strategy:
    """The baseline of least cost under ``cost`` (after ``pin`` fixes pinned units) among
    those ``admits`` accepts (the search space's policies; all when it accepts none)."""
    found = {name: pin(s) for name, s in baselines(graph, cluster,
                                                   memory_limit=memory_limit).items()}
    found = {name: s for name, s in found.items() if admits(s)} or found
    scored = [(cost(s).cost, name, s) for name, s in found.items()]
    return min(scored, key=lambda x: (x[0], x[1]))[2]
