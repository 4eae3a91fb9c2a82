"""The optimal schedule of a chain as a Strategy: :func:`optimal_checkpointing`.

The schedules are those memflow can express and PyTorch runs: every unit is kept or recomputed
(or offloaded, when asked), and each maximal run of recomputed units is one checkpoint segment
(``torch.utils.checkpoint``: its inputs are held, what its units save is dropped and rebuilt by
one re-run of the segment's forward just before its backward). The DP
(:func:`~memflow.planners.checkpointing.solver.solve`) returns one policy per unit; a Strategy
with those policies on the base placement *is* that schedule, since
:meth:`~memflow.Strategy.with_policy` groups each run of recomputed units into one segment.

The time is the keep-everything time plus the forward time of every recomputed unit (and what
the transfers of an offloaded one add), which is the simulated iteration time on one device
(all tasks share one stream). On a data-parallel ``base`` the memory is still exact, the time
is the compute time (gradient all-reduces overlap it), and the result reports the simulated
time. :class:`CheckpointResult` carries both what the DP predicted and what the simulator says.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from ...errors import SearchError
from ...hardware.limits import memory_limits
from ...sim import Simulator
from ...strategy import Strategy
from ..common import as_cluster
from .chain import KEEP_, OFF_, POLICY, REC_, ChainMemory, chain_violation, forward_times, span
from .solver import solve

__all__ = ["optimal_checkpointing", "CheckpointResult", "CHECKPOINT", "LEAST", "SLOTS",
           "EXACT_UP_TO"]

CHECKPOINT = ("keep", "recompute")
LEAST = ("time", "memory")      # what optimal_checkpointing minimizes first
# slots="auto": exact fronts answer in a fraction of a second up to EXACT_UP_TO units; longer
# chains get SLOTS memory slots (rotor's order of magnitude: 0.3 s on 100 units)
EXACT_UP_TO, SLOTS = 40, 500


@dataclass(frozen=True)
class CheckpointResult:
    """An optimal schedule, what the DP predicted and what the simulator says of it."""

    strategy: Strategy
    time: float               # simulated iteration time
    peak: float               # simulated peak of the most loaded device
    feasible: bool
    predicted_time: float
    predicted_peak: float
    memory_limit: float
    recomputed: tuple[str, ...]
    offloaded: tuple[str, ...] = ()


def optimal_checkpointing(graph, device: Any, memory_limit: Any = None, *,
                          base: Strategy | None = None, policies: Sequence[str] = CHECKPOINT,
                          optimizer: str = "sgd", precision: str | None = None,
                          slots: int | str | None = "auto", least: str = "time"
                          ) -> CheckpointResult:
    """The least-time keep/recompute schedule of a chain that fits ``memory_limit``; with
    ``least="memory"``, the least-time one among those of the least peak memory, whether or
    not it fits (``feasible`` says).

    ``device`` is a :class:`memflow.Cluster` or a preset name: the chain runs on its first
    device, or on ``base``'s placement (one placement for every unit, e.g. data parallel).
    ``memory_limit`` (bytes or ``"8GB"``) defaults to the device's capacity.
    ``policies=("keep", "recompute", "offload")`` adds offloading as a third choice per unit,
    its time being what the simulator's transfers add
    (:meth:`~memflow.planners.checkpointing.chain.ChainMemory.offload_time`). ``slots`` cuts
    memory into slots of ``limit / slots`` as rotor does, keeping one schedule per slot (see
    :mod:`.solver`): what it returns always fits, may be slower than the optimum by what
    ``n`` slots of memory would buy (0.08% on 100 units at 500 slots), and a 100-unit chain
    solves in about 0.3 s of CPU at ``slots=500``; ``slots=None`` is exact (0.1 s at 36 units,
    11 s at 100), and the default ``"auto"`` is exact up to ``EXACT_UP_TO`` (40) units and
    ``SLOTS`` (500) slots beyond. With ``least="memory"`` and ``slots`` the least peak is approximate in the
    same way (the schedule's own peak is still the simulator's). Raises :class:`~memflow.errors.SearchError` when the graph is not a
    chain or (``least="time"``) nothing fits.

    >>> from memflow.search.synthetic import chain_graph
    >>> g = chain_graph(8, batch=16384, width=64)       # keeping everything peaks at 97 MB
    >>> res = optimal_checkpointing(g, "1xV100-16GB", 80e6)
    >>> res.feasible, res.peak <= 80e6, res.peak == res.predicted_peak
    (True, True, True)
    >>> abs(res.time - res.predicted_time) < 1e-12, res.recomputed
    (True, ('l0', 'l3', 'l4'))
    >>> low = optimal_checkpointing(g, "1xV100-16GB", 10e6, least="memory")
    >>> low.feasible, low.peak == low.predicted_peak < res.peak
    (False, True)
    """
    if least not in LEAST:
        raise SearchError(f"optimal_checkpointing: least={least!r}; valid: {', '.join(LEAST)}")
    if slots == "auto":
        slots = None if len(graph) <= EXACT_UP_TO else SLOTS
    elif slots is not None and (isinstance(slots, bool) or not isinstance(slots, int)
                                or slots < 1):
        raise SearchError(f"optimal_checkpointing: slots={slots!r}; valid: a positive "
                          "integer, None (exact) or 'auto'")
    cluster = as_cluster(device, "device")
    bad = [p for p in policies if p not in POLICY.values()]
    if bad or "keep" not in policies:
        raise SearchError(f"optimal_checkpointing: policies={list(policies)} must include "
                          f"'keep' and be among {list(POLICY.values())}")
    why = chain_violation(graph)
    if why is not None:
        raise SearchError(f"optimal_checkpointing needs a chain: {why}; capture with "
                          "units='blocks' or use memflow.search.exhaustive")
    if base is None:
        base = Strategy.single_device(graph, str(cluster.devices.index[0]))
    base.validate(graph, cluster)
    if len(base.layouts) != 1 or (base.stage >= 0).any() or base.microbatches != 1:
        raise SearchError("optimal_checkpointing needs one placement for every unit, no "
                          "pipeline stages and one micro-batch; got "
                          f"{len(base.layouts)} placements, microbatches={base.microbatches}")
    base = base.with_policy(keep=list(graph.names))
    sim = Simulator(graph, cluster, optimizer=optimizer, precision=precision)
    used = cluster.devices.index.get_indexer(list(base.devices[0]))
    limit = float(memory_limits(cluster, memory_limit)[used].min())
    run = sim.run(base)
    chain = ChainMemory(sim, base, span(sim.ga)[0], offload="offload" in policies)
    allowed = [[KEEP_] + ([REC_] if "recompute" in policies and sim.ga.recomputable[v] else [])
               + ([OFF_] if "offload" in policies else []) for v in range(len(graph))]
    fwd = forward_times(run, len(graph))
    if least == "memory":
        T, P, types = solve(chain, fwd, allowed, math.inf, slots, least="memory")
        if not slots:           # the exact least peak, then the fastest schedule within it
            T, P, types = solve(chain, fwd, allowed, P)
    else:
        T, P, types = solve(chain, fwd, allowed, limit - chain.persistent, slots)
    if types is None:
        raise SearchError(f"no {'/'.join(policies)} schedule of "
                          f"{graph.meta.get('model', 'the chain')} fits memory_limit="
                          f"{limit:,.0f} bytes on {list(base.devices[0])}")
    best, chosen = _as_strategy(base, list(graph.names), types)
    ev = sim.evaluate(best)
    peak = float(ev.peak[used].max())
    return CheckpointResult(best, ev.iteration_time, peak, bool(peak <= limit),
                            run.iteration_time + T, chain.persistent + P, limit,
                            chosen[REC_], chosen[OFF_])


def _as_strategy(base: Strategy, names: list[str], types: list[int]
                 ) -> tuple[Strategy, dict[int, tuple[str, ...]]]:
    """``base`` with the DP's policy per unit, named after what it does, and the units
    recomputed and offloaded (by policy code)."""
    chosen = {k: tuple(u for u, x in zip(names, types) if x == k) for k in (REC_, OFF_)}
    label = "optimal checkpointing" + (" and offloading" if chosen[OFF_] else "")
    if len(base.devices[0]) > 1:
        label = f"{base.name}, {label}"
    best = base.with_policy(recompute=list(chosen[REC_]), offload=list(chosen[OFF_]))
    return best.with_schedule(name=label), chosen
