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

import operator
from collections import OrderedDict
from dataclasses import replace
from itertools import chain
from typing import Any, NamedTuple

import numpy as np

from ..errors import SimulationError
from ..memory.arrays import GraphArrays, graph_arrays
from ..memory.blocks import BlockTable, StepBlocks
from ..memory.records import Placed, placements
from ..memory.states import stage_arrays
from ..strategy.shard_levels import OPTIMIZERS, PRECISIONS
from ..strategy.strategy import Strategy
from .costs import CopyRoutes, copy_cost, copy_times, layout_cost
from .cpu_time import (compress_model, compressed_maps, compression_ratios, cpu_figures,
                       parameter_tensors, saved_tensors, step_ratio)
from .durations import placement_timing, policy_timing
from .shapes import unit_kernels
from .expand import expand
from .replication import as_run, replicated_arrays, split_degrees
from .structure import structure, with_states
from .folding import classes
from .layouts import REGION, LayoutTable
from .ledger import ledger_plan, ledgers
from .precision import ACTIVATION_WIDTH, activation_arrays
from .run import ByLayouts, Evaluation, OfLayouts, Placement, Prepared, Run
from .schedule import schedule

__all__ = ["Simulator", "Evaluation", "Run", "Placement", "PRECISIONS"]


def _layout_degrees(strategy: Strategy) -> np.ndarray:
    """``(sample, parameter, attribute)`` of each of ``strategy``'s layouts (read-only; made
    once per strategy: a new placement reads them three times)."""
    degrees = strategy._cache.get("layout_degrees")
    if degrees is None:
        layouts = strategy.layouts
        degrees = np.fromiter(chain.from_iterable([k[:3] for k in layouts]), np.int64,
                              3 * len(layouts)).reshape(-1, 3)
        degrees.flags.writeable = False
        strategy._cache["layout_degrees"] = degrees
    return degrees


class _PlacementKey(NamedTuple):
    """What a strategy's placement is cached under (:meth:`Simulator._placement_key`)."""

    layout_ids: bytes
    layouts: tuple
    stage: bytes
    microbatches: int
    schedule: str
    shard: bytes
    offload: bytes
    precision: str
    sequence: bytes
    scale: bytes        # what as_run scales


_but_states = operator.itemgetter(*(i for i, f in enumerate(_PlacementKey._fields)
                                    if f not in ("shard", "offload")))
"""A placement key's fields but the model states' (shard levels, optimizer places): what a
shard move's placement shares with its sibling's."""


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
        # per unit, parameter and saved tensors, kernels and the maps a compress hook packs:
        # graph constants the CPU model reads per timing
        self._cpu_tensors = None if self._cpu is None else (parameter_tensors(graph),
                                                            saved_tensors(graph),
                                                            unit_kernels(graph),
                                                            compressed_maps(graph))
        # each layout met: its cost figures, rates and channels
        self._layouts = LayoutTable(lambda key: layout_cost(self.ca, key, self._route))
        self._copy_cost: dict[tuple, Any] = {}
        self._routes: dict[tuple[int, int], list[int]] = {}
        self._placed: dict[tuple, Placed] = {}
        self._arrays: dict[tuple, GraphArrays] = {}
        # per placement key but model states, the last used last (evicted one at a time:
        # clearing all at once freed 256 placements in one proposal)
        self._states_of: OrderedDict[tuple, Placement] = OrderedDict()
        self._placements: OrderedDict[tuple, Placement] = OrderedDict()
        self._layouts_cache: dict[tuple, ByLayouts] = {}
        self._of_layouts_cache: dict[tuple, OfLayouts] = {}
        self._copy_routes = CopyRoutes(self._cc)    # each copy route met: cost and channels
        self._compress: tuple | None = None
        self._rates: dict[tuple, float] = {}
        self._prepared_cache: OrderedDict[tuple, Prepared] = OrderedDict()

    @property
    def compression(self) -> tuple:
        """``(expected_ratio, throughput, launches, per_call)`` of :mod:`memflow.compress`
        (:func:`~memflow.sim.cpu_time.compress_model`), loaded when a strategy first
        compresses."""
        if self._compress is None:
            self._compress = compress_model(self._cpu and self._cpu["clock"])
        return self._compress

    # ------------------------------------------------------------------ pieces
    def _half_maps(self, strategy: Strategy) -> np.ndarray:
        """Per unit: its feature maps are 16-bit (captured so, or cast by the precision)."""
        return self.ga.half | (self.precision_of(strategy) in ACTIVATION_WIDTH)

    def _ratios(self, strategy: Strategy) -> np.ndarray:
        measured = self.graph.meta.get("map_bits")      # the model's own maps' ratios
        ratio_of = (step_ratio(bool(self._cpu), measured) if measured
                    else lambda eb, dtype, kind: self.compression[0](eb, dtype, kind))
        return compression_ratios(strategy, self._half_maps(strategy), ratio_of)

    def _placed_of(self, strategy: Strategy) -> Placed:
        # keyed by the placement key's parts but the devices, the layouts' degrees as the
        # units' (the same partition given the layout ids; a tuple of arrays made from the
        # layouts cost as much as the records' Python glue)
        pk = self._placement_key(strategy)
        key = (pk.layout_ids, strategy.sample.tobytes(), strategy.parameter.tobytes(),
               strategy.attribute.tobytes(), pk.microbatches, pk.precision, pk.sequence,
               pk.scale, pk.stage)
        placed = self._placed.get(key)
        if placed is None:
            if len(self._placed) > 4 * self.cache_size:   # placements seen long ago
                self._placed.clear()
            placed = self._placed[key] = placements(
                self.arrays(strategy), strategy.layout_ids,
                (strategy.sample * strategy.attribute).astype(np.float64),
                split_degrees(strategy, _layout_degrees(strategy)), strategy.microbatches,
                sequence=strategy.sequence_parallel, stage=strategy.stage)
        return placed

    def precision_of(self, strategy: Strategy) -> str:
        """The precision ``strategy`` trains in: its own, else this simulator's default."""
        return strategy.precision or self.precision

    def arrays(self, strategy: Strategy) -> GraphArrays:
        """The graph's arrays with activations at the width ``strategy``'s precision computes
        them in (:func:`memflow.sim.precision.activation_arrays`); in a pipeline, a weight is
        charged to every stage that reads it (:func:`memflow.memory.states.stage_copies`); a
        unit replicated on its tensor-parallel group, whole on each of its devices
        (:mod:`memflow.sim.replication`)."""
        base = self._placement_key(strategy)
        key = (base.precision, base.stage, base.scale)
        ga = self._arrays.get(key)
        if ga is None:    # a pipeline's copies make new arrays: once per stage assignment, so
            if len(self._arrays) > self.cache_size:     # that the records' pairs are reused
                self._arrays.clear()
            run = as_run(strategy, self.graph)
            ga = self._arrays[key] = replicated_arrays(
                stage_arrays(activation_arrays(self.graph, key[0]), strategy.stage),
                run.scale, run.whole, run.rowwise)
        return ga

    def _scale_key(self, strategy: Strategy) -> bytes:
        """What :func:`~memflow.sim.replication.as_run` scales, as part of a cache key."""
        return self._placement_key(strategy).scale

    def _placement_key(self, strategy: Strategy) -> _PlacementKey:
        """What the placement of ``strategy`` is cached under: its layouts, stages,
        micro-batches, schedule, shard levels, optimizer places, precision, sequence
        parallelism and what :func:`~memflow.sim.replication.as_run` scales. Made once per
        strategy and kept on it (a strategy never changes; a simulation reads this five
        times, and made it each time)."""
        hit = strategy._cache.get("placement_key")
        if hit is not None and hit[0] is self.graph and hit[1] == self.precision:
            return hit[2]
        run = as_run(strategy, self.graph)
        key = _PlacementKey(
            strategy.layout_ids.tobytes(), tuple(strategy.layouts), strategy.stage.tobytes(),
            strategy.microbatches, strategy.schedule, strategy.shard.tobytes(),
            strategy.offload_optimizer.tobytes(), self.precision_of(strategy),
            strategy.sequence_parallel.tobytes(),
            b"".join(b"-" if a is None else a.tobytes() for a in run[1:]))
        strategy._cache["placement_key"] = (self.graph, self.precision, key)
        return key

    def _table(self, strategy: Strategy, placed: Placed, foreach: bool = True) -> BlockTable:
        degrees = _layout_degrees(strategy)
        return BlockTable(self.arrays(strategy), placed, strategy.layout_ids, degrees, strategy.microbatches,
                          optimizer=self.optimizer, foreach=foreach,
                          precision=self.precision_of(strategy), shard=strategy.shard,
                          offload=strategy.offload_optimizer)

    def blocks(self, strategy: Strategy, *, foreach: bool = True) -> StepBlocks:
        """The memory plan of ``strategy`` (blocks with anchors)."""
        strategy = as_run(strategy, self.graph)[0]
        table = self._table(strategy, self._placed_of(strategy), foreach)
        return table.derive(strategy.policy, strategy.segment, self._ratios(strategy))

    def _lc(self, key: tuple):
        return self._layouts.lcs[self._layouts.number(key)]

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

    def _of_layouts(self, keys: tuple, fold: bool) -> OfLayouts:
        """What the layouts ``keys`` decide whatever units take them (cached by them: a copy
        move often gives units another of the same layouts, which re-derived all of this)."""
        k = (keys, fold)
        hit = self._of_layouts_cache.get(k)
        if hit is None:
            if len(self._of_layouts_cache) > 4 * self.cache_size:   # layouts seen long ago
                self._of_layouts_cache.clear()
            hit = self._of_layouts_cache[k] = self._layouts.of(
                self._layouts.numbers(keys), self.ca.host, len(self.ca.devices), fold)
        return hit

    def _by_layouts(self, strategy: Strategy, placed: Placed, fold: bool) -> ByLayouts:
        """Copy times, channel sets and classes of ``strategy``'s layouts (cached by them)."""
        keys = tuple(strategy.layouts)
        key = (strategy.layout_ids.tobytes(), keys, strategy.microbatches,
               self.precision_of(strategy), fold)
        hit = self._layouts_cache.get(key)
        if hit is not None:
            return hit
        n = len(self.ca.devices)
        of = self._of_layouts(keys, fold)
        # channel sets: the layouts' own, then copies, copies back
        copy, back, raw = copy_times(keys, of.numbers, placed.copies,
                                     self.arrays(strategy).per_sample, of.rates[:, REGION], n,
                                     self._copy_routes, of.channels)
        ch_cls, sets = classes(*raw, 2 * n + len(self.ca.link_rate), fold)
        if len(self._layouts_cache) > 4 * self.cache_size:   # layouts seen long ago
            self._layouts_cache.clear()
        hit = self._layouts_cache[key] = ByLayouts(copy, back, raw, ch_cls, sets, of,
                                                   int(ch_cls.max()) + 1)
        return hit

    def placement(self, strategy: Strategy, fold: bool = True) -> Placement:
        """What the placements of ``strategy`` (:func:`~memflow.sim.replication.as_run`)
        decide (cached)."""
        strategy = as_run(strategy, self.graph)[0]
        key = (self._placement_key(strategy), fold)
        hit = self._placements.get(key)
        if hit is not None:
            self._placements.move_to_end(key)
            return hit
        placed = self._placed_of(strategy)
        degrees = _layout_degrees(strategy)
        # the same layouts with other model states (a shard move): their block table re-made
        # only where the states decide it, and derived from its last plan by delta
        kin = (_but_states(key[0]), fold)
        sibling = self._states_of.get(kin)
        if sibling is not None:
            self._states_of.move_to_end(kin)
        if sibling is not None and sibling.placed is placed:
            table = sibling.blocks.with_states(
                self.arrays(strategy), strategy.layout_ids, degrees, optimizer=self.optimizer,
                precision=self.precision_of(strategy), shard=strategy.shard,
                offload=strategy.offload_optimizer)
            S = with_states(sibling.structure, self.arrays(strategy), degrees, table.states)
        else:
            table = self._table(strategy, placed)
            S = structure(self.arrays(strategy), placed, strategy.layout_ids, degrees,
                          strategy.stage, strategy.microbatches, strategy.schedule, table.states,
                          split_degrees(strategy, degrees))
        R = self._by_layouts(strategy, placed, fold)
        timing = placement_timing(self, strategy, S, table.states, R)
        of = R.of
        out = Placement(
            placed=placed, blocks=table, structure=S, timing=timing, sets=R.sets,
            raw_sets=R.raw, n_channel_classes=R.n_channel_classes,
            channel_class=R.channel_class, device_class=of.device_class,
            layout_classes=of.layout_classes, layout_hosts=of.layout_hosts,
            n_device_classes=of.n_device_classes, devices_used=of.devices_used,
            mem_rate=of.mem_rate, launch=of.launch)
        self._placements[key] = out
        if len(self._placements) > self.cache_size:
            self._placements.popitem(last=False)
        self._states_of[kin] = out
        self._states_of.move_to_end(kin)
        if len(self._states_of) > self.cache_size:
            self._states_of.popitem(last=False)
        return out

    # ------------------------------------------------------------------ runs
    def _prepared(self, strategy: Strategy, fold: bool) -> Prepared:
        """Tasks, blocks, durations and ledgers of ``strategy`` (cached by structure: a search
        that revisits a strategy, or re-times one, skips all of this)."""
        key = (strategy.policy.tobytes(), strategy.error_bound.tobytes(),
               self._placement_key(strategy), fold)
        hit = self._prepared_cache.get(key)
        if hit is not None:
            self._prepared_cache.move_to_end(key)
            return hit
        P = self.placement(strategy, fold)
        plan = P.blocks.derive(strategy.policy, strategy.segment, self._ratios(strategy))
        T = expand(P.structure, policy_timing(self, strategy, P, plan), plan)
        if P.ledger is None:      # what the placement fixes of the ledger, once
            P.ledger = ledger_plan(plan, P.layout_classes, P.n_device_classes, P.layout_hosts,
                                   len(self.ca.host_memory))
        prep = Prepared(blocks=plan, tasks=T, placement=P,
                         ledger=replace(P.ledger, rows=plan.rows))
        self._prepared_cache[key] = prep
        if len(self._prepared_cache) > self.cache_size:
            self._prepared_cache.popitem(last=False)
        return prep

    def run(self, strategy: Strategy, *, fold: bool = True) -> Run:
        """Simulate one step of ``strategy``; every array of the outcome (its ``strategy``
        the one run: :func:`~memflow.sim.replication.as_run`)."""
        if self.ca is None:
            raise SimulationError("this simulator has no cluster; give one to time a strategy")
        strategy = as_run(strategy, self.graph)[0]
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
        out = SimResult(self, self.run(strategy, fold=fold))
        out.strategy = strategy     # the one asked for; its run's layouts place the tasks
        return out

