"""The simulator object: a graph and a cluster prepared once, strategies evaluated many times.

``Simulator(graph, cluster).evaluate(strategy)`` returns a small :class:`Evaluation` (time, peak
per device, feasible) for a search's inner loop; ``.result(strategy)`` the full
:class:`~memflow.sim.result.SimResult`. Per-placement cost figures and copy routes are cached
across strategies, so a search that changes one unit re-derives only that unit's placement.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import SimulationError
from ..memory.arrays import GraphArrays, graph_arrays
from ..memory.plan import OPTIMIZER_STATES, MemoryPlan, memory_plan
from ..strategy.strategy import Strategy
from .costs import (OPTIMIZER_LAUNCHES, OPTIMIZER_TRAFFIC, compress_model, compression_ratios,
                    copy_cost, layout_cost, ring_time)
from .expand import (K_ALLRED, K_BWD, K_COMPRESS, K_DECOMP, K_FWD, K_OFFLOAD, K_OPT,
                     K_PREFETCH, K_RECOMP, K_XFER, R_COMM, R_COMPUTE,
                     R_COPY, R_COPYBACK, R_D2H, R_H2D, Tasks, expand)
from .folding import classes
from .ledger import Ledger, LedgerPlan, anchor_tasks, ledger, ledger_plan
from .schedule import csr, schedule

__all__ = ["Simulator", "Evaluation", "Run", "PRECISIONS"]

PRECISIONS = ("fp32", "amp")


@dataclass(frozen=True)
class Evaluation:
    """What a search needs from one simulation."""

    iteration_time: float
    peak: np.ndarray          # bytes per device, in cluster order
    capacity: np.ndarray
    feasible: bool

    @property
    def over(self) -> float:
        """Bytes over capacity on the worst device (0 when feasible)."""
        return float(np.max(np.maximum(self.peak - self.capacity, 0.0), initial=0.0))


@dataclass
class Run:
    """Everything one simulation produced, as arrays (DataFrames are made by SimResult)."""

    strategy: Strategy
    tasks: Tasks
    plan: MemoryPlan
    start: np.ndarray
    end: np.ndarray
    duration: np.ndarray
    task_channels: list[tuple[int, ...]]   # folded channel classes
    channels: dict                        # (role, key) -> raw channel ids
    channel_class: np.ndarray             # channel -> class
    device_class: np.ndarray              # device -> class
    device: Ledger
    host: Ledger
    iteration_time: float
    devices_used: np.ndarray              # device positions the strategy uses


@dataclass
class _Prepared:
    """What a strategy's structure and the cluster fix before any timing."""

    plan: MemoryPlan
    tasks: Tasks
    duration: np.ndarray
    channels: dict
    task_channels: list[tuple[int, ...]]
    deps_csr: tuple[np.ndarray, np.ndarray]
    channels_csr: tuple[np.ndarray, np.ndarray]
    n_channel_classes: int
    channel_class: np.ndarray
    device_class: np.ndarray
    device_ledger: LedgerPlan
    host_ledger: LedgerPlan
    devices_used: np.ndarray


class Simulator:
    """Simulate strategies of one graph on one cluster.

    >>> import pandas as pd, memflow
    >>> from memflow.graph import OpGraph
    >>> g = OpGraph(pd.DataFrame({"fwd_flops": [1e9, 1e9], "bwd_flops": [2e9, 2e9],
    ...                           "param_bytes": [1 << 20] * 2, "trainable_bytes": [1 << 20] * 2},
    ...                          index=["a", "b"]),
    ...             pd.DataFrame({"bytes": [1000, 2000], "producer": ["<input>", "a"],
    ...                           "consumers": [["a"], ["b"]], "savers": [["a"], ["b"]]}),
    ...             {"batch_size": 8})
    >>> sim = Simulator(g, memflow.Cluster.preset("4xV100-16GB"))
    >>> ev = sim.evaluate(memflow.Strategy.data_parallel(g, 4))
    >>> ev.feasible, ev.peak.shape
    (True, (4,))
    """

    def __init__(self, graph, cluster, *, optimizer: str = "sgd", precision: str | None = None):
        if optimizer not in OPTIMIZER_STATES:
            raise SimulationError(f"unknown optimizer {optimizer!r}; valid: "
                                  f"{', '.join(OPTIMIZER_STATES)}")
        if precision is None:
            precision = "amp" if graph.meta.get("autocast") else "fp32"
        if precision not in PRECISIONS:
            raise SimulationError(f"unknown precision {precision!r}; valid: {', '.join(PRECISIONS)}")
        self.graph, self.cluster = graph, cluster
        self.cache_size = 256
        self.optimizer, self.precision = optimizer, precision
        self.ga: GraphArrays = graph_arrays(graph)
        self.ca = cluster.arrays if cluster is not None else None
        self._layout_cost: dict[tuple, Any] = {}
        self._copy_cost: dict[tuple, Any] = {}
        self._routes: dict[tuple[int, int], list[int]] = {}
        self._placement_cache: dict[tuple, Any] = {}
        self._compress: tuple | None = None
        self._prepared_cache: OrderedDict[tuple, _Prepared] = OrderedDict()

    @property
    def compression(self) -> tuple:
        """``(expected_ratio, throughput)`` of :mod:`memflow.compress`, loaded when a strategy
        first compresses."""
        if self._compress is None:
            self._compress = compress_model()
        return self._compress

    # ------------------------------------------------------------------ pieces
    def plan(self, strategy: Strategy, *, foreach: bool = True) -> MemoryPlan:
        """The memory plan of ``strategy`` (blocks with anchors)."""
        degrees = np.array([k[:3] for k in strategy.layouts], np.int64)
        ratio = compression_ratios(strategy, self.ga.half,
                                   lambda eb, dtype: self.compression[0](eb, dtype))
        return memory_plan(self.ga, strategy.policy, strategy.segment, strategy.layout_ids,
                           degrees, strategy.microbatches, ratio, optimizer=self.optimizer,
                           foreach=foreach, cache=self._placement_cache)

    def _lc(self, key: tuple):
        lc = self._layout_cost.get(key)
        if lc is None:
            lc = self._layout_cost[key] = layout_cost(self.ca, key)
        return lc

    def _cc(self, src: tuple, dst: tuple, per_sample: bool):
        k = (src, dst, per_sample)
        cc = self._copy_cost.get(k)
        if cc is None:
            cc = self._copy_cost[k] = copy_cost(self.ca, src, dst, per_sample, self._route)
        return cc

    def _route(self, a: int, b: int) -> list[int]:
        path = self._routes.get((a, b))
        if path is None:
            path = self._routes[(a, b)] = self.ca.routing.route(a, b)
        return path

    def _timing(self, strategy: Strategy, T: Tasks, plan: MemoryPlan):
        """Duration and raw channel ids of every task."""
        ga, M = self.ga, strategy.microbatches
        n = len(self.ca.devices)
        keys = strategy.layouts
        lcs = [self._lc(k) for k in keys]
        kind = np.asarray(T.kind)
        unit = np.asarray(T.unit)
        key = np.asarray(T.key)
        work = np.asarray(T.work)
        dur = np.zeros(len(kind))
        # compute tasks of units, vectorized over tasks
        comp = np.isin(kind, (K_FWD, K_BWD, K_RECOMP))
        if comp.any():
            u, L = unit[comp], key[comp]
            deg = np.array([k[0] * k[1] * k[2] for k in keys], np.float64)[L] * M
            bwd = kind[comp] == K_BWD
            flops = np.where(bwd, ga.bwd_flops[u], ga.fwd_flops[u]) / deg
            moved = np.where(bwd, ga.bwd_bytes_moved[u], ga.fwd_bytes_moved[u]) / deg
            ops = np.where(bwd, ga.bwd_ops[u], ga.fwd_ops[u])
            half = ga.half[u] | (self.precision == "amp")
            f32 = np.array([lc.flops32 for lc in lcs])[L]
            f16 = np.array([lc.flops16 for lc in lcs])[L]
            mem = np.array([lc.mem_rate for lc in lcs])[L]
            launch = np.array([lc.launch for lc in lcs])[L]
            ring = np.array([lc.param_ring for lc in lcs])[L]
            dur[comp] = (np.maximum(flops / np.where(half, f16, f32), moved / mem) + ops * launch
                         + ring_time(work[comp], ring[:, 0], ring[:, 1], ring[:, 2]))
        channels: dict[tuple[int, int], np.ndarray] = {}
        red = np.flatnonzero(kind == K_ALLRED)
        if len(red):   # DDP's gradient buckets over the replicas
            ring = np.array([lc.replica_ring for lc in lcs])[key[red]]
            dur[red] = ring_time(work[red], ring[:, 0], ring[:, 1], ring[:, 2])
        for i in np.flatnonzero(~comp & (kind != K_ALLRED)):
            k, L, w = int(kind[i]), int(key[i]), float(work[i])
            if k in (K_OFFLOAD, K_PREFETCH):
                _, per, lat = lcs[L].d2h if k == K_OFFLOAD else lcs[L].h2d
                dur[i] = w * per + lat
            elif k in (K_COMPRESS, K_DECOMP):
                rate = self.compression[1](lcs[L].mem_rate, decompress=k == K_DECOMP,
                                           error_bound=float(strategy.error_bound[unit[i]]))
                dur[i] = w / rate
            elif k == K_XFER:
                c = plan.copies[L]
                src, dst = keys[c.src_layout], keys[c.dst_layout]
                back = T.role[i] == R_COPYBACK
                links, per, lat = self._cc(dst, src, ga.per_sample[c.tensor]) if back else \
                    self._cc(src, dst, ga.per_sample[c.tensor])
                whole = w * (dst[0] * dst[2] if ga.per_sample[c.tensor] else 1)
                dur[i] = whole * per + lat if len(links) else 0.0
                channels[(T.role[i], L)] = 2 * n + links
            elif k == K_OPT:
                mine = strategy.layout_ids == L
                train = float(np.sum(ga.trainable_bytes[mine])) / keys[L][1]
                lc = lcs[L]
                dur[i] = (OPTIMIZER_TRAFFIC[self.optimizer] * train / lc.mem_rate
                          + OPTIMIZER_LAUNCHES * lc.launch)
        for r, L in set(zip(T.role, T.key)):
            if (r, L) in channels:
                continue
            lc = lcs[L] if r not in (R_COPY, R_COPYBACK) else None
            if r == R_COMPUTE:
                channels[(r, L)] = lc.devices
            elif r == R_COMM:
                channels[(r, L)] = n + lc.devices
            elif r == R_D2H:
                channels[(r, L)] = 2 * n + lc.d2h[0]
            elif r == R_H2D:
                channels[(r, L)] = 2 * n + lc.h2d[0]
        return dur, channels

    # ------------------------------------------------------------------ runs
    def _prepared(self, strategy: Strategy, fold: bool) -> "_Prepared":
        """Tasks, blocks, durations and channel classes of ``strategy`` (cached by structure:
        a search that revisits a strategy, or re-times one, skips all of this)."""
        key = (strategy.policy.tobytes(), strategy.error_bound.tobytes(),
               strategy.stage.tobytes(), tuple(strategy.layouts),
               strategy.layout_ids.tobytes(), strategy.microbatches, strategy.schedule, fold)
        hit = self._prepared_cache.get(key)
        if hit is not None:
            self._prepared_cache.move_to_end(key)
            return hit
        plan = self.plan(strategy)
        T = expand(self.ga, strategy, plan, self._placement_cache)
        if len(self._placement_cache) > 4 * self.cache_size:   # placements seen long ago
            self._placement_cache.clear()
        dur, chan_sets = self._timing(strategy, T, plan)
        n_dev = len(self.ca.devices)
        n_ch = 2 * n_dev + len(self.ca.link_rate)
        set_keys = list(chan_sets)
        ch_cls, per_set = classes([chan_sets[k] for k in set_keys], n_ch, fold)
        folded = {k: tuple(per_set[j].tolist()) for j, k in enumerate(set_keys)}
        lcs = [self._lc(k) for k in strategy.layouts]
        dev_cls, lay_cls = classes([lc.devices for lc in lcs], n_dev, fold)
        alloc, frees, idx = anchor_tasks(plan, T.anchor, T.first_mb, strategy.microbatches)
        h = plan.on_host[idx]
        task_channels = [folded[(r, L)] for r, L in zip(T.role, T.key)]
        prep = _Prepared(
            plan=plan, tasks=T, duration=dur, channels=chan_sets, task_channels=task_channels,
            deps_csr=csr(T.deps), channels_csr=csr(task_channels),
            n_channel_classes=int(ch_cls.max()) + 1, channel_class=ch_cls,
            device_class=dev_cls,
            device_ledger=ledger_plan(plan, alloc[~h], frees[~h], idx[~h], lay_cls,
                                      int(dev_cls.max()) + 1),
            host_ledger=ledger_plan(plan, alloc[h], frees[h], idx[h],
                                    [self.ca.host[lc.devices] for lc in lcs],
                                    len(self.ca.host_memory), host=True),
            devices_used=np.unique(np.concatenate([lc.devices for lc in lcs])))
        self._prepared_cache[key] = prep
        if len(self._prepared_cache) > self.cache_size:
            self._prepared_cache.popitem(last=False)
        return prep

    def run(self, strategy: Strategy, *, fold: bool = True) -> Run:
        """Simulate one step of ``strategy``; every array of the outcome."""
        if self.ca is None:
            raise SimulationError("this simulator has no cluster; give one to time a strategy")
        P = self._prepared(strategy, fold)
        start, end = schedule(P.deps_csr, P.channels_csr, P.duration, P.n_channel_classes)
        dev = ledger(P.device_ledger, start, end)
        hst = ledger(P.host_ledger, start, end)
        return Run(strategy, P.tasks, P.plan, start, end, P.duration, P.task_channels,
                   P.channels, P.channel_class, P.device_class, dev, hst,
                   float(end.max(initial=0.0)), P.devices_used)

    def evaluate(self, strategy: Strategy, *, fold: bool = True) -> Evaluation:
        """Time, peak per device and feasibility of ``strategy`` (no DataFrames)."""
        r = self.run(strategy, fold=fold)
        peak = r.device.peak[r.device_class]
        cap = self.ca.memory
        return Evaluation(r.iteration_time, peak, cap, bool(np.all(peak <= cap)))

    def result(self, strategy: Strategy, *, fold: bool = True):
        """The full :class:`~memflow.sim.result.SimResult` of ``strategy``."""
        from .result import SimResult
        return SimResult(self, self.run(strategy, fold=fold))
