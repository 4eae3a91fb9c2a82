"""What every planner shares: input checks, the memory limit it plans for, and the
infeasible-answer convention. Strategies are judged by :class:`~memflow.sim.Evaluator`, the
search's judge too.

**Convention.** A planner that returns a :class:`~memflow.Strategy` returns one that the
simulator finds within the memory limit on every device it uses. When no strategy the planner
can build fits, it raises :class:`Infeasible` (a :class:`~memflow.errors.PlanError`) whose
message gives the smallest peak memory it found; the exception carries that figure
(``min_memory``, bytes) and the strategy that reached it (``best``), so a caller can retry with
a larger limit or start a search from ``best``. Planners that return a table mark such rows
``feasible = False`` instead of raising.

>>> err = Infeasible("checkpoint", "sqrt", limit=1e9, min_memory=1.5e9)
>>> print(err)
checkpoint: no 'sqrt' strategy fits memory_limit=954 MiB; the smallest peak found is 1.4 GiB; give memory_limit >= 1.4 GiB (1500000000 bytes)
>>> isinstance(err, PlanError), err.min_memory
(True, 1500000000.0)
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._units import format_bytes
from ..errors import ClusterError, PlanError
from ..hardware import Cluster, memory_limits
from ..sim import Evaluator, Outcome
from ..sim.kinds import K_BWD, K_FWD
from ..strategy import Strategy

__all__ = ["Infeasible", "Profile", "as_cluster", "as_limit", "fastest", "check_graph"]


class Infeasible(PlanError):
    """No strategy a planner can build fits the memory limit.

    ``min_memory`` is the smallest peak (bytes, worst device) among the strategies it tried and
    ``best`` the strategy that reached it (None when it built none).
    """

    def __init__(self, planner: str, method: str, *, limit: float, min_memory: float,
                 best: Strategy | None = None, detail: str = ""):
        self.planner, self.method = planner, method
        self.limit, self.min_memory, self.best = float(limit), float(min_memory), best
        found = (f"the smallest peak found is {format_bytes(min_memory)}; give memory_limit >= "
                 f"{format_bytes(min_memory)} ({int(math.ceil(min_memory))} bytes)"
                 if math.isfinite(min_memory) else "no strategy could be built")
        super().__init__(f"{planner}: no {method!r} strategy fits memory_limit="
                         f"{format_bytes(limit)}; {found}" + (f" ({detail})" if detail else ""))


def as_cluster(cluster: Any, what: str = "cluster") -> Cluster:
    """A :class:`~memflow.Cluster` from a cluster or a preset name.

    >>> len(as_cluster("4xV100-16GB"))
    4
    >>> as_cluster(3)
    Traceback (most recent call last):
    ...
    memflow.errors.PlanError: cluster must be a memflow.Cluster or a preset name such as '1xV100-16GB' or 'jetson-nano-4GB', got 3
    """
    if isinstance(cluster, Cluster):
        return cluster
    if isinstance(cluster, str):
        return Cluster.preset(cluster)
    raise PlanError(f"{what} must be a memflow.Cluster or a preset name such as '1xV100-16GB' "
                    f"or 'jetson-nano-4GB', got {cluster!r}")


def as_limit(memory_limit: Any, cluster: Cluster, devices: list[str] | None = None) -> float:
    """The bytes a planner may use on each of ``devices`` (all of the cluster's by default):
    the least of :func:`~memflow.hardware.limits.memory_limits` over them, so ``None`` is the
    smallest capacity; a limit the planner cannot read is its input error (a ``PlanError``).

    >>> c = Cluster.preset("1xV100-16GB")
    >>> as_limit(None, c) / 2**30, as_limit("2GiB", c) / 2**30, as_limit("25%", c) / 2**30
    (16.0, 2.0, 4.0)
    >>> as_limit(-1, c)
    Traceback (most recent call last):
    ...
    memflow.errors.PlanError: cannot read a size from -1: memory_limit must be a positive number of bytes, a size such as '16GB' or '8 GiB', a fraction of capacity such as 0.8 or '80%', or a mapping of device names to these
    """
    try:
        limits = memory_limits(cluster, memory_limit)
    except ClusterError as exc:
        raise PlanError(str(exc)) from None
    if devices is not None:
        limits = limits[cluster.arrays.devices.get_indexer(devices)]
    return float(limits.min())


def check_graph(graph: Any, planner: str) -> None:
    """Raise a :class:`PlanError` unless ``graph`` is an OpGraph with a batch size."""
    from ..graph import OpGraph
    if not isinstance(graph, OpGraph):
        raise PlanError(f"{planner}: graph must be a memflow OpGraph (memflow.zoo.graph(...) or "
                        f"memflow.from_torch(...)), got {type(graph).__name__}")
    batch = graph.meta.get("batch_size")
    if not isinstance(batch, (int, np.integer)) or batch < 1:
        raise PlanError(f"{planner}: graph.meta['batch_size'] must be a positive integer, got "
                        f"{batch!r}")


def fastest(ev: Evaluator, strategies, planner: str, method: str, limit: float) -> Outcome:
    """The fastest fitting outcome (ties: least memory) of ``strategies`` on ``ev``, or
    :class:`Infeasible` naming ``limit`` (the planner's, in bytes) and the least peak found."""
    outs = [ev(s) for s in strategies]
    if not outs:
        raise Infeasible(planner, method, limit=limit, min_memory=math.inf)
    fitting = [o for o in outs if o.fits]
    if not fitting:
        low = min(outs, key=lambda o: o.peak)
        raise Infeasible(planner, method, limit=limit, min_memory=low.peak, best=low.strategy)
    return min(fitting, key=lambda o: (o.time, o.peak))


@dataclass(frozen=True)
class Profile:
    """Per-unit figures of a one-device run with everything kept (what the heuristics weigh).

    ``fwd`` and ``bwd`` are the simulated seconds of each unit's forward and backward (the
    simulator's own time model, so heuristics and simulation agree); ``saved`` the bytes each
    unit holds for backward; ``d2h`` and ``h2d`` seconds per byte over the device's host link
    and ``latency`` its latency.
    """

    fwd: np.ndarray
    bwd: np.ndarray
    saved: np.ndarray
    d2h: float
    h2d: float
    latency: float

    @classmethod
    def of(cls, evaluator: Evaluator, base: Strategy) -> "Profile":
        """Profile ``base`` (its memory policies reset to keep) on ``evaluator``'s cluster."""
        keep = base.with_policy({u: "keep" for u in base.units})
        run = evaluator.simulator.run(keep)
        kind, unit = np.asarray(run.tasks.kind), np.asarray(run.tasks.unit)
        n = len(base)
        fwd, bwd = np.zeros(n), np.zeros(n)
        np.add.at(fwd, unit[kind == K_FWD], run.duration[kind == K_FWD])
        np.add.at(bwd, unit[kind == K_BWD], run.duration[kind == K_BWD])
        ca = evaluator.cluster.arrays
        dev = int(ca.devices.get_indexer([base.devices[0][0]])[0])
        up, down = ca.host_route(dev, True), ca.host_route(dev, False)
        per = (lambda path: float(np.max(1.0 / ca.link_rate[path])) if len(path) else 0.0)
        lat = float(ca.link_latency[up].sum()) if len(up) else 0.0
        saved = evaluator.graph.units["saved_bytes"].to_numpy(np.float64)
        return cls(fwd, bwd, saved / base.degree.clip(min=1), per(up), per(down), lat)
