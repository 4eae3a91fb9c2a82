"""The simulator object: a graph and a cluster prepared once, strategies evaluated many times.

``Simulator(graph, cluster).evaluate(strategy)`` returns a small :class:`Evaluation` (time, peak
per device, feasible) for a search's inner loop; ``.result(strategy)`` the full
:class:`~memflow.sim.result.SimResult`.

Work is split by what it depends on, and each part is cached under what it depends on:

* per placement (degrees and devices of one unit): cost figures, copy routes (a move that
  changes one unit's placement derives only that placement);
* per strategy placement (every unit's placement, stages, micro-batches): the records of the
  memory plan, the expansion's structure, durations, channel and device classes
  (:class:`Placement`);
* per memory policies: the policy blocks, re-derived by delta for the records the changed
  units touch (:class:`~memflow.memory.blocks.BlockTable`), then the tasks and the ledgers;
* per strategy: the schedule and the ledger sweep, every time (a revisited strategy skips the
  rest).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import numpy as np

from ..errors import SimulationError
from ..memory.arrays import GraphArrays, graph_arrays
from ..memory.blocks import BlockTable, StepBlocks
from ..memory.records import Placed, placements
from ..memory.states import stage_arrays, stage_copies
from ..strategy.policies import M_COMPRESSED, M_HOST, M_RECOMPUTE, M_SELECTIVE, POLICIES
from ..strategy.shard_levels import OPTIMIZERS, PRECISIONS
from ..strategy.strategy import Strategy
from .costs import (CPU_ADAM_RATE, OPTIMIZER_LAUNCHES, compress_model, compression_ratios,
                    cpu_compute, cpu_figures, cpu_hooks, cpu_optimizer, parameter_tensors,
                    saved_tensors,
                    copy_cost, copy_times, layout_cost, ring_time, tied_allreduce)
from .expand import Tasks, Timing, expand
from .structure import Structure, structure
from .folding import classes, rows_of, stack_rows
from .ledger import Ledger, LedgerPlan, ledger_plan, ledgers
from .precision import ACTIVATION_WIDTH, activation_arrays
from .schedule import schedule

__all__ = ["Simulator", "Evaluation", "Run", "Placement", "PRECISIONS"]

# columns of a layout's row of rates (Simulator._lc_row)
_DEGREE, _FLOPS32, _FLOPS16, _MEM, _LAUNCH, _PARAM_RING, _REPLICA_RING, _D2H, _H2D = \
    0, 1, 2, 3, 4, 5, 8, 11, 13



@dataclass(frozen=True)
class Evaluation:
    """What a search needs from one simulation."""

    iteration_time: float
    peak: np.ndarray          # bytes per device, in cluster order
    capacity: np.ndarray
    feasible: bool
    host_over: float = 0.0    # offloaded bytes over memory on the worst host the strategy uses

    @property
    def over(self) -> float:
        """Bytes over capacity on the worst device or host (0 when feasible)."""
        return max(float(np.max(np.maximum(self.peak - self.capacity, 0.0), initial=0.0)),
                   self.host_over)


@dataclass
class Placement:
    """What the placement of every unit (with stages and micro-batches) decides."""

    placed: Placed
    blocks: BlockTable
    structure: Structure
    timing: Timing
    sets: tuple[np.ndarray, np.ndarray]     # CSR: channel classes of each channel set
    raw_sets: tuple[np.ndarray, np.ndarray]  # CSR: raw channel ids of each channel set
    n_channel_classes: int
    channel_class: np.ndarray
    device_class: np.ndarray
    layout_classes: list[np.ndarray]
    layout_hosts: list[np.ndarray]
    n_device_classes: int
    devices_used: np.ndarray
    mem_rate: np.ndarray                    # per layout, for compression speed
    launch: np.ndarray                      # per layout: seconds per kernel launch
    ledger: LedgerPlan | None = None        # the ledger's classes (rows: any plan's)


@dataclass
class Run:
    """Everything one simulation produced, as arrays (DataFrames are made by SimResult)."""

    strategy: Strategy
    tasks: Tasks
    blocks: StepBlocks
    start: np.ndarray
    end: np.ndarray
    placement: Placement
    device: Ledger
    host: Ledger
    iteration_time: float

    @property
    def duration(self) -> np.ndarray:
        return self.tasks.duration

    @property
    def device_class(self) -> np.ndarray:
        """Class of each device of the cluster (devices with identical ledgers share one)."""
        return self.placement.device_class

    @property
    def channel_class(self) -> np.ndarray:
        return self.placement.channel_class

    @property
    def devices_used(self) -> np.ndarray:
        """Positions of the devices the strategy uses."""
        return self.placement.devices_used

    @cached_property
    def task_channels(self) -> list[tuple[int, ...]]:
        """Channel classes each task occupies."""
        ptr, idx = self.placement.sets
        return [tuple(idx[ptr[s]:ptr[s + 1]].tolist()) for s in self.tasks.channel_set]


@dataclass(frozen=True)
class _ByLayouts:
    """What the units' layouts (degrees and devices) alone fix: copy times and the channel
    and device classes, kept when a move changes only model states or stages."""

    copy: np.ndarray                        # seconds of each copy
    back: np.ndarray                        # and of its gradient's way back
    raw: tuple[np.ndarray, np.ndarray]      # CSR: raw channel ids of each channel set
    channel_class: np.ndarray
    sets: tuple[np.ndarray, np.ndarray]
    device_class: np.ndarray
    layouts: tuple[np.ndarray, np.ndarray]  # CSR: device classes of each layout
    layout_classes: list[np.ndarray]        # the same, split per layout
    layout_hosts: list[np.ndarray]          # hosts of each layout's devices
    devices_used: np.ndarray
    mem_rate: np.ndarray                    # per layout
    launch: np.ndarray


@dataclass
class _Prepared:
    """What a strategy's structure and the cluster fix before any timing."""

    blocks: StepBlocks
    tasks: Tasks
    placement: Placement
    ledger: LedgerPlan


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
        if optimizer not in OPTIMIZERS:
            raise SimulationError(f"unknown optimizer {optimizer!r}; valid: "
                                  f"{', '.join(OPTIMIZERS)}")
        if precision is None:
            precision = "amp" if graph.meta.get("autocast") else "fp32"
        if precision not in PRECISIONS:
            raise SimulationError(f"unknown precision {precision!r}; valid: {', '.join(PRECISIONS)}")
        self.graph, self.cluster = graph, cluster
        self.cache_size = 256
        self.optimizer, self.precision = optimizer, precision
        self.ga: GraphArrays = graph_arrays(graph)
        self.ca = cluster.arrays if cluster is not None else None
        self._cpu = cpu_figures(cluster)      # a CPU measured here: its own time model
        self._layout_cost: dict[tuple, Any] = {}
        self._rows: dict[tuple, np.ndarray] = {}      # per layout: its rates as one row
        self._copy_cost: dict[tuple, Any] = {}
        self._routes: dict[tuple[int, int], list[int]] = {}
        self._placed: dict[tuple, Placed] = {}
        self._arrays: dict[tuple, GraphArrays] = {}
        self._states_of: dict[tuple, Placement] = {}   # per placement key but model states
        self._placements: OrderedDict[tuple, Placement] = OrderedDict()
        self._layouts_cache: dict[tuple, _ByLayouts] = {}
        self._compress: tuple | None = None
        self._rates: dict[tuple, float] = {}
        self._prepared_cache: OrderedDict[tuple, _Prepared] = OrderedDict()

    @property
    def compression(self) -> tuple:
        """``(expected_ratio, throughput, launches)`` of :mod:`memflow.compress`, loaded when
        a strategy first compresses."""
        if self._compress is None:
            self._compress = compress_model(self._cpu and self._cpu["clock"])
        return self._compress

    # ------------------------------------------------------------------ pieces
    def _half_maps(self, strategy: Strategy) -> np.ndarray:
        """Per unit: its feature maps are 16-bit (captured so, or cast by the precision)."""
        return self.ga.half | (self.precision_of(strategy) in ACTIVATION_WIDTH)

    def _ratios(self, strategy: Strategy) -> np.ndarray:
        return compression_ratios(strategy, self._half_maps(strategy),
                                  lambda eb, dtype: self.compression[0](eb, dtype))

    def _placed_of(self, strategy: Strategy) -> Placed:
        layout, M = strategy.layout_ids, strategy.microbatches
        degrees = np.array([k[:3] for k in strategy.layouts], np.int64)
        key = (layout.tobytes(), degrees.tobytes(), M, self.precision_of(strategy),
               strategy.sequence_parallel.tobytes())
        placed = self._placed.get(key)
        if placed is None:
            if len(self._placed) > 4 * self.cache_size:   # placements seen long ago
                self._placed.clear()
            placed = self._placed[key] = placements(
                self.arrays(strategy), layout, (degrees[layout, 0] * degrees[layout, 2]).astype(np.float64),
                degrees[layout, 1], M, sequence=strategy.sequence_parallel)
        return placed

    def precision_of(self, strategy: Strategy) -> str:
        """The precision ``strategy`` trains in: its own, else this simulator's default."""
        return strategy.precision or self.precision

    def arrays(self, strategy: Strategy) -> GraphArrays:
        """The graph's arrays with activations at the width ``strategy``'s precision computes
        them in (:func:`memflow.sim.precision.activation_arrays`); in a pipeline, a weight is
        charged to every stage that reads it (:func:`memflow.memory.states.stage_copies`)."""
        key = (self.precision_of(strategy), strategy.stage.tobytes())
        ga = self._arrays.get(key)
        if ga is None:    # a pipeline's copies make new arrays: once per stage assignment, so
            if len(self._arrays) > self.cache_size:     # that the records' pairs are reused
                self._arrays.clear()
            ga = self._arrays[key] = stage_arrays(activation_arrays(self.graph, key[0]),
                                                  strategy.stage)
        return ga

    def _table(self, strategy: Strategy, placed: Placed, foreach: bool = True) -> BlockTable:
        degrees = np.array([k[:3] for k in strategy.layouts], np.int64)
        return BlockTable(self.arrays(strategy), placed, strategy.layout_ids, degrees, strategy.microbatches,
                          optimizer=self.optimizer, foreach=foreach,
                          precision=self.precision_of(strategy), shard=strategy.shard,
                          offload=strategy.offload_optimizer)

    def blocks(self, strategy: Strategy, *, foreach: bool = True) -> StepBlocks:
        """The memory plan of ``strategy`` (blocks with anchors)."""
        table = self._table(strategy, self._placed_of(strategy), foreach)
        return table.derive(strategy.policy, strategy.segment, self._ratios(strategy))

    def _lc(self, key: tuple):
        lc = self._layout_cost.get(key)
        if lc is None:
            lc = self._layout_cost[key] = layout_cost(self.ca, key, self._route)
        return lc

    def _lc_row(self, key: tuple, lc) -> np.ndarray:
        row = self._rows.get(key)
        if row is None:
            row = self._rows[key] = np.array(
                [key[0] * key[1] * key[2], lc.flops32, lc.flops16, lc.mem_rate, lc.launch,
                 *lc.param_ring, *lc.replica_ring, *lc.d2h[1:], *lc.h2d[1:]], np.float64)
        return row

    def _cc(self, src: tuple, dst: tuple, per_sample: bool):
        k = (src, dst, per_sample)
        cc = self._copy_cost.get(k)
        if cc is None:
            cc = self._copy_cost[k] = copy_cost(self.ca, src, dst, per_sample, self._route,
                                                (self._lc(src).devices, self._lc(dst).devices))
        return cc

    def _route(self, a: int, b: int) -> list[int]:
        path = self._routes.get((a, b))
        if path is None:
            path = self._routes[(a, b)] = self.ca.routing.route(a, b)
        return path

    def _by_layouts(self, strategy: Strategy, placed: Placed, fold: bool) -> _ByLayouts:
        """Copy times, channel sets and classes of ``strategy``'s layouts (cached by them)."""
        key = (strategy.layout_ids.tobytes(), tuple(strategy.layouts), strategy.microbatches,
               self.precision_of(strategy), fold)
        hit = self._layouts_cache.get(key)
        if hit is not None:
            return hit
        n = len(self.ca.devices)
        keys = strategy.layouts
        lcs = [self._lc(k) for k in keys]
        copy, back, links_fwd, links_back = copy_times(
            keys, placed.copies, self.ga.per_sample[placed.copies.tensor], n, self._cc)
        # channel sets: compute, comm, to-host, from-host per layout, then copies, copies back
        raw = stack_rows(rows_of([lc.devices for lc in lcs] + [n + lc.devices for lc in lcs]
                                 + [2 * n + lc.d2h[0] for lc in lcs]
                                 + [2 * n + lc.h2d[0] for lc in lcs]), links_fwd, links_back)
        ch_cls, sets = classes(*raw, 2 * n + len(self.ca.link_rate), fold)
        dev_cls, lay = classes(*rows_of([lc.devices for lc in lcs]), n, fold)
        if len(self._layouts_cache) > 4 * self.cache_size:   # layouts seen long ago
            self._layouts_cache.clear()
        self._layouts_cache[key] = _ByLayouts(
            copy, back, raw, ch_cls, sets, dev_cls, lay,
            layout_classes=np.split(lay[1], lay[0][1:-1]),
            layout_hosts=[self.ca.host[lc.devices] for lc in lcs],
            devices_used=np.unique(np.concatenate([lc.devices for lc in lcs])),
            mem_rate=np.array([lc.mem_rate for lc in lcs]),
            launch=np.array([lc.launch for lc in lcs]))
        return self._layouts_cache[key]

    def _timing(self, strategy: Strategy, S: Structure, states, routes: _ByLayouts) -> Timing:
        """Durations that the placements (and the model states) fix."""
        ga, M = self.arrays(strategy), strategy.microbatches
        keys = strategy.layouts
        lcs = [self._lc(k) for k in keys]
        L = strategy.layout_ids
        # one row of rates per layout (cached by placement key), spread over the units
        rates = np.stack([self._lc_row(k, lc) for k, lc in zip(keys, lcs)])
        deg = rates[L, _DEGREE] * M
        half = ga.half | (self.precision_of(strategy) != "fp32")
        f32, f16 = rates[L, _FLOPS32], rates[L, _FLOPS16]
        mem = rates[:, _MEM]
        launch = rates[L, _LAUNCH]
        ring = rates[L, _PARAM_RING:_PARAM_RING + 3]
        rate = np.where(half, f16, f32)

        def compute(flops, moved, ops, work):
            return (np.maximum(flops / deg / rate, moved / deg / mem[L]) + ops * launch
                    + ring_time(work, ring[:, 0], ring[:, 1], ring[:, 2]))

        fwd = compute(ga.fwd_flops, ga.fwd_bytes_moved, ga.fwd_ops, S.tp_out)
        cheap = compute(ga.fwd_flops - ga.expensive_fwd_flops,
                        ga.fwd_bytes_moved - ga.expensive_fwd_bytes_moved,
                        ga.fwd_ops - ga.expensive_fwd_ops, S.tp_out)
        bwd = compute(ga.bwd_flops, ga.bwd_bytes_moved, ga.bwd_ops, S.tp_in)
        if self._cpu is not None:
            tensors = parameter_tensors(self.graph)
            fwd, cheap, bwd = (t + ring_time(w, ring[:, 0], ring[:, 1], ring[:, 2]) for t, w in
                               zip(cpu_compute(ga, self._cpu, rate, deg, tensors),
                                   (S.tp_out, S.tp_out, S.tp_in)))
        rr = rates[:, _REPLICA_RING:_REPLICA_RING + 3][S.bucket_layout]
        allreduce = ring_time(S.bucket_bytes, rr[:, 0], rr[:, 1], rr[:, 2])
        # ring all-gather and reduce-scatter each move half an all-reduce's bytes
        ru = rates[L, _REPLICA_RING:_REPLICA_RING + 3]
        gather = ring_time(S.gather, ru[:, 0], ru[:, 1], ru[:, 2]) / 2
        scatter = ring_time(S.scatter, ru[:, 0], ru[:, 1], ru[:, 2]) / 2
        optimizer = (np.bincount(L, weights=states.update, minlength=len(keys)) / mem
                     + OPTIMIZER_LAUNCHES * rates[:, _LAUNCH])
        if self._cpu is not None:
            optimizer = cpu_optimizer(L, states.update, tensors, mem, self._cpu)
        if strategy.stage.max() > 0:
            whole = graph_arrays(self.graph)      # the weights as the graph has them, once
            optimizer += tied_allreduce(whole, stage_copies(whole, strategy.stage), L, keys,
                                        self._cc)
        off = strategy.offload_optimizer
        for i in np.unique(L[(states.regather > 0) | off]).tolist():
            lc, mine = lcs[i], L == i
            # ZeRO-1/2: each replica updated its shard; the new parameters are all-gathered
            regather = states.regather[mine]
            if regather.any():
                optimizer[i] += float(ring_time(regather.sum(), *lc.replica_ring)) / 2
            if off[mine].any():    # ZeRO-Offload: gradients down, CPU Adam, parameters up
                on_host = np.bincount(self.ca.host[lc.devices]).max()
                optimizer[i] += (float(np.sum(states.gradients[mine & off])) * lc.d2h[1]
                                 + on_host * float(np.sum(states.host_elements[mine]))
                                 / CPU_ADAM_RATE
                                 + float(np.sum(states.weights[mine & off])) * lc.h2d[1]
                                 + lc.d2h[2] + lc.h2d[2])
        return Timing(forward=fwd, backward=bwd, allreduce=allreduce, copy=routes.copy,
                        copy_back=routes.back,
                        d2h=rates[:, _D2H:_D2H + 2], h2d=rates[:, _H2D:_H2D + 2],
                        host_scale=np.ones(ga.n), optimizer=optimizer,
                        compress=np.ones(ga.n), decompress=np.ones(ga.n), gather=gather,
                        scatter=scatter, cheap_forward=cheap)

    def placement(self, strategy: Strategy, fold: bool = True) -> Placement:
        """What the placements of ``strategy`` decide (cached)."""
        key = (strategy.layout_ids.tobytes(), tuple(strategy.layouts), strategy.stage.tobytes(),
               strategy.microbatches, strategy.schedule, fold, strategy.shard.tobytes(),
               strategy.offload_optimizer.tobytes(), self.precision_of(strategy),
               strategy.sequence_parallel.tobytes())
        hit = self._placements.get(key)
        if hit is not None:
            self._placements.move_to_end(key)
            return hit
        placed = self._placed_of(strategy)
        degrees = np.array([k[:3] for k in strategy.layouts], np.int64)
        # the same layouts with other model states (a shard move): their block table re-made
        # only where the states decide it, and derived from its last plan by delta
        kin = key[:6] + key[8:]
        sibling = self._states_of.get(kin)
        if sibling is not None and sibling.placed is placed:
            table = sibling.blocks.with_states(
                self.arrays(strategy), strategy.layout_ids, degrees, optimizer=self.optimizer,
                precision=self.precision_of(strategy), shard=strategy.shard,
                offload=strategy.offload_optimizer)
        else:
            table = self._table(strategy, placed)
        S = structure(self.arrays(strategy), placed, strategy.layout_ids, degrees, strategy.stage,
                      strategy.microbatches, strategy.schedule, table.states)
        R = self._by_layouts(strategy, placed, fold)
        timing = self._timing(strategy, S, table.states, R)
        out = Placement(
            placed=placed, blocks=table, structure=S, timing=timing, sets=R.sets,
            raw_sets=R.raw, n_channel_classes=int(R.channel_class.max()) + 1,
            channel_class=R.channel_class, device_class=R.device_class,
            layout_classes=R.layout_classes, layout_hosts=R.layout_hosts,
            n_device_classes=int(R.device_class.max()) + 1, devices_used=R.devices_used,
            mem_rate=R.mem_rate, launch=R.launch)
        self._placements[key] = out
        if len(self._placements) > self.cache_size:
            self._placements.popitem(last=False)
        if len(self._states_of) > self.cache_size:
            self._states_of.clear()
        self._states_of[kin] = out
        return out

    def _policy_timing(self, strategy: Strategy, P: Placement, plan: StepBlocks) -> Timing:
        """``P.timing`` with what the units' policies set: the policy table's host time factor
        (``Policy.host_scale``) and the compression speed of the units that compress — the
        quantizer's memory-bound throughput on the unit's devices plus its kernel launches
        (at the code width of the unit's ratio), as one rate over the bytes it compresses; a
        selective unit's recomputation re-runs its cheap ops only."""
        scale = POLICIES.host_scales[strategy.policy]
        units = np.flatnonzero(plan.compressed > 0)
        sel = POLICIES.selective(strategy.policy)
        fixed = {"host_scale": scale}
        if sel.any():
            fixed["recompute"] = np.where(sel, P.timing.cheap_forward, P.timing.forward)
        # offload and compress hooks, and recompute's checkpoint: a Python pack and unpack
        hooked = np.isin(POLICIES.mechanism_codes[strategy.policy],
                         (M_HOST, M_COMPRESSED, M_RECOMPUTE, M_SELECTIVE))
        if self._cpu is not None and hooked.any():     # export's hooks, on the CPU's thread
            fixed["forward"] = P.timing.forward + cpu_hooks(
                plan.offloaded, hooked, saved_tensors(self.graph), self._cpu)
        if not len(units):
            if len(fixed) == 1 and (scale == 1.0).all():
                return P.timing
            return Timing(**{**P.timing.__dict__, **fixed})
        comp, decomp = np.ones(self.ga.n), np.ones(self.ga.n)
        ratio, half = self._ratios(strategy), self._half_maps(strategy)
        _, throughput, launches = self.compression
        for u in units.tolist():
            lay, eb = int(strategy.layout_ids[u]), float(strategy.error_bound[u])
            bits = (16 if half[u] else 32) / ratio[u]
            nbytes = float(plan.compressed[u])
            for out, back in ((comp, False), (decomp, True)):
                k = (float(P.mem_rate[lay]), back, eb)
                r = self._rates.get(k)
                if r is None:
                    r = self._rates[k] = throughput(k[0], decompress=back, error_bound=eb)
                out[u] = nbytes / (nbytes / r + launches(bits, decompress=back) * P.launch[lay])
        return Timing(**{**P.timing.__dict__, "compress": comp, "decompress": decomp, **fixed})

    # ------------------------------------------------------------------ runs
    def _prepared(self, strategy: Strategy, fold: bool) -> _Prepared:
        """Tasks, blocks, durations and ledgers of ``strategy`` (cached by structure: a search
        that revisits a strategy, or re-times one, skips all of this)."""
        key = (strategy.policy.tobytes(), strategy.error_bound.tobytes(),
               strategy.stage.tobytes(), tuple(strategy.layouts),
               strategy.layout_ids.tobytes(), strategy.microbatches, strategy.schedule, fold,
               strategy.shard.tobytes(), strategy.offload_optimizer.tobytes(),
               self.precision_of(strategy))
        hit = self._prepared_cache.get(key)
        if hit is not None:
            self._prepared_cache.move_to_end(key)
            return hit
        P = self.placement(strategy, fold)
        plan = P.blocks.derive(strategy.policy, strategy.segment, self._ratios(strategy))
        T = expand(P.structure, self._policy_timing(strategy, P, plan), plan)
        if P.ledger is None:      # what the placement fixes of the ledger, once
            P.ledger = ledger_plan(plan, P.layout_classes, P.n_device_classes, P.layout_hosts,
                                   len(self.ca.host_memory))
        prep = _Prepared(blocks=plan, tasks=T, placement=P,
                         ledger=replace(P.ledger, rows=plan.rows))
        self._prepared_cache[key] = prep
        if len(self._prepared_cache) > self.cache_size:
            self._prepared_cache.popitem(last=False)
        return prep

    def run(self, strategy: Strategy, *, fold: bool = True) -> Run:
        """Simulate one step of ``strategy``; every array of the outcome."""
        if self.ca is None:
            raise SimulationError("this simulator has no cluster; give one to time a strategy")
        p = self._prepared(strategy, fold)
        T, P = p.tasks, p.placement
        start, end = schedule((T.dep_ptr, T.dep_idx), T.channel_set, P.sets, T.duration,
                              P.n_channel_classes)
        device, host = ledgers(p.ledger, T, start, end)
        return Run(strategy, T, p.blocks, start, end, P, device, host, float(end.max(initial=0.0)))

    def evaluate(self, strategy: Strategy, *, fold: bool = True) -> Evaluation:
        """Time, peak per device and feasibility of ``strategy`` (no DataFrames); feasible
        when every device and every host it uses holds its peak."""
        r = self.run(strategy, fold=fold)
        peak = r.device.peak[r.device_class]
        cap = self.ca.memory
        hosts = np.unique(self.ca.host[r.devices_used])
        host_over = float(np.max(r.host.peak[hosts] - self.ca.host_memory[hosts], initial=0.0))
        return Evaluation(r.iteration_time, peak, cap,
                          bool(np.all(peak <= cap)) and host_over <= 0, max(host_over, 0.0))

    def result(self, strategy: Strategy, *, fold: bool = True):
        """The full :class:`~memflow.sim.result.SimResult` of ``strategy``."""
        from .result import SimResult
        return SimResult(self, self.run(strategy, fold=fold))
