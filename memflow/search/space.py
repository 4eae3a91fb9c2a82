"""The search space: what each unit may be given, and which units the search may touch.

A unit's parallel configuration is FlexFlow's: degrees over the sample, parameter and attribute
dimensions (within the unit's ``max_parameter_degree`` / ``max_attribute_degree``, the batch and
the device count) and one device per part. Part counts divide the device count, and a config
move places the parts on an aligned run of devices (``k`` parts on devices ``j·k … j·k+k-1``),
which keeps groups inside a node where nodes are contiguous; the swap move reaches every other
placement one device at a time. A unit's memory policy is one of ``policies`` (``recompute``
only where the graph allows it; ``compress`` with one of ``error_bounds``).

By default the space is what export runs (:mod:`memflow.strategy.runnable`): one sample
degree for every unit (the ``replicas`` move changes it for all), parameter splits only of
units export can slice, no attribute splits, sequence parallelism only of split blocks on the
tensor-parallel path (:mod:`memflow.strategy.sequence_parallel`). ``runnable=False`` opens FlexFlow's full
per-unit space, for research: the simulator judges such strategies, but export refuses them.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Iterable, Sequence

import numpy as np

from ..errors import SearchError
from ..memory.arrays import graph_arrays
from ..sim.precision import BF16_PRECISIONS
from ..strategy import POLICIES, parse_policy
from ..strategy.runnable import (RUNNABLE, model_state_problem, parallel_kinds,
                                 parameter_limits, pipeline_problem, root_sharded, runs_amp,
                                 sample_problem, sequence_problem, sequence_units, unrunnable)
from ..strategy.shard_levels import S_GRADIENTS
from ..strategy.validate import divides_tensor_degree

__all__ = ["SearchSpace", "DEFAULT_POLICIES", "policy_label", "OPTIMIZER_PLACES",
           "shard_choices", "precision_choices", "without_sequence"]

DEFAULT_POLICIES = POLICIES.searched
"""The built-in policies the search proposes when none are named (the policy table's
``searched`` rows). Lossy compression changes training numerics, so it is not among them: the
search uses it only when asked."""


def policy_label(code: int, bound: float) -> str:
    """``"recompute"``, or ``"compress:0.001"`` for compress with its error bound.

    >>> policy_label(3, 0.001), policy_label(0, float("nan"))
    ('compress:0.001', 'keep')
    """
    name = POLICIES[code]
    return f"{name}:{bound:g}" if POLICIES.with_parameter[code] else name


@lru_cache(maxsize=None)
def _factorizations(k: int) -> tuple[tuple[int, int, int], ...]:
    return tuple((s, p, k // (s * p)) for s in range(1, k + 1) if k % s == 0
                 for p in range(1, k // s + 1) if (k // s) % p == 0)


class SearchSpace:
    """Per-unit choices of a graph on a cluster, and the pinned (frozen) units.

    >>> import memflow
    >>> from memflow.search.synthetic import chain_graph
    >>> sp = SearchSpace(chain_graph(3, batch=8), memflow.Cluster.preset("4xV100-16GB"))
    >>> sp.part_counts, sp.groups(2)
    ((1, 2, 4), [('gpu0', 'gpu1'), ('gpu2', 'gpu3')])
    >>> sp.degrees(0, microbatches=1), sp.policy_choices(0)
    ([(1, 1, 1), (2, 1, 1), (4, 1, 1)], [(0, nan), (1, nan), (2, nan)])
    >>> full = SearchSpace(chain_graph(3, batch=8), memflow.Cluster.preset("4xV100-16GB"),
    ...                    runnable=False)     # FlexFlow's space: any split of a unit
    >>> len(full.degrees(0, microbatches=1)) > 5
    True
    >>> sp.recompute, SearchSpace(chain_graph(3), memflow.Cluster.preset("1xV100-16GB"),
    ...                           policies=("keep", "offload")).may_recompute.tolist()
    (1, [False, False, False])
    """

    def __init__(self, graph, cluster, *, policies: Sequence[str] = DEFAULT_POLICIES,
                 error_bounds: Sequence[float] = (1e-3,), runnable: bool = True):
        self.graph = graph
        self.names: list[str] = list(graph.names)
        self.n = len(self.names)
        self.position = {u: i for i, u in enumerate(self.names)}
        self.devices: list[str] = [str(d) for d in cluster.devices.index]
        nd = len(self.devices)
        self._groups: dict[int, list[tuple[str, ...]]] = {}
        self._device_index = {d: j for j, d in enumerate(self.devices)}
        self.part_counts = tuple(k for k in range(1, nd + 1) if nd % k == 0)
        u = graph.units
        self.runnable = bool(runnable)
        if self.runnable:       # what export runs: sliceable units only, no attribute split
            self.max_p = parameter_limits(graph)
            self.max_a = np.ones(self.n, np.int64)
            # units sharded in the model's root fully_shard group change level together
            self.root_sharded = root_sharded(graph)
        else:
            self.max_p = u["max_parameter_degree"].to_numpy(np.int64)
            self.max_a = u["max_attribute_degree"].to_numpy(np.int64)
            self.root_sharded = np.zeros(self.n, bool)
        # a block Megatron splits takes only degrees dividing its heads and widths
        self.tensor_degree = u["tensor_degree"].to_numpy(np.int64)
        # per unit and parameter degree up to the device count, whether the unit may take it
        # (:meth:`fits`), and the degrees each unit may take (:meth:`degrees`): a config move
        # asks for every factorization of every part count, one numpy call each
        degrees = np.arange(nd + 1)
        self._fits = (degrees <= self.max_p[:, None]) & divides_tensor_degree(
            self.tensor_degree[:, None], degrees)
        self._degrees: dict[tuple, list[tuple[int, int, int]]] = {}
        # the units that may be sequence parallel once split, their sequence length each:
        # blocks and normalizations (memflow.strategy.sequence_parallel) the space splits
        self.sequence = np.where(self.max_p > 1, sequence_units(graph), 0)
        if self.runnable and not RUNNABLE.sequence_parallel:
            self.sequence[:] = 0
        self.batch = int(graph.meta.get("batch_size") or 0)
        self.recomputable = graph_arrays(graph).recomputable
        # selective where it differs from recompute (the unit has expensive ops to keep) and,
        # in the runnable space, where export runs it (replays: memflow.strategy.runnable)
        self.replays = u["selective_replays"].to_numpy(bool) if self.runnable else \
            np.ones(self.n, bool)
        self.selective = (u["expensive_fwd_ops"].to_numpy() > 0) & self.replays
        bad = [p for p in policies if p not in POLICIES]
        if bad or not policies:
            raise SearchError(f"policies={list(policies)}: "
                              + (f"{bad[0]!r} is not a memory policy" if bad else "none given")
                              + f"; valid: {', '.join(POLICIES)}")
        bounded = [p for p in policies if POLICIES[p].parameter]
        if bounded and not error_bounds:
            raise SearchError(f"policies include {bounded[0]!r} but error_bounds is empty; give "
                              "the error bounds the search may use, e.g. error_bounds=(1e-3,)")
        self.policies = tuple(policies)
        self.error_bounds = tuple(float(parse_policy("", (bounded[0] if bounded else "compress",
                                                          e))[1]) for e in error_bounds)
        self._choices: list[tuple[int, float]] = []
        for p in self.policies:        # a policy with a parameter: one choice per error bound
            code = POLICIES.index(p)
            self._choices += ([(code, e) for e in self.error_bounds]
                              if POLICIES[p].parameter else [(code, float("nan"))])
        # what segment moves give and give back: the space's first policy carried out by
        # recomputation (None: segment moves have nothing to propose) and keep, if allowed
        codes = [c for c, _ in self._choices]
        self.recompute = next((c for c in codes if c in POLICIES.codes("recompute")), None)
        self.keep = next((c for c in codes if c in POLICIES.codes("keep")), None)
        self.may_recompute = self.recomputable & (self.recompute is not None)
        self.pinned = np.zeros(self.n, bool)
        self._free: tuple[bytes | None, np.ndarray] = (None, np.arange(0))
        self.precision_pinned = False      # the global precision is fixed (MCMCSearch.pin)
        # bf16 precisions are proposed only where some device has bf16 units: elsewhere they
        # hold what amp holds at the FP32 rate (a pin or a given strategy still runs them)
        self.bf16 = bool(cluster.devices["bf16"].any())
        # amp runs in the runnable space only on a graph holding its program (capture's amp
        # pass): halving an fp32 capture is not what the exported autocast step holds
        self.amp = runs_amp(graph)

    # ------------------------------------------------------------------ units
    def index(self, units: str | Iterable[str]) -> list[int]:
        """Positions of ``units`` (a name or names); unknown names raise naming the unit."""
        units = [units] if isinstance(units, str) else list(units)
        out = []
        for name in units:
            if name not in self.position:
                close = [v for v in self.names if str(name) in v][:3]
                raise SearchError(f"{name!r} is not a unit of the graph"
                                  + (f"; did you mean {close}?" if close else
                                     f"; units start {self.names[:3]}"))
            out.append(self.position[name])
        return out

    def free(self) -> np.ndarray:
        """Positions of the units the search may change (not pinned)."""
        # asked by most moves; made again only when the pins changed (pin() sets them in place)
        pins = self.pinned.tobytes()
        if pins != self._free[0]:
            free = np.flatnonzero(~self.pinned)
            free.flags.writeable = False
            self._free = (pins, free)
        return self._free[1]

    # ------------------------------------------------------------------ choices
    def fits(self, i: int, p: int) -> bool:
        """Whether unit ``i`` may take parameter degree ``p``: within its largest split, and
        dividing its ``tensor_degree`` (:func:`~memflow.strategy.validate.divides_tensor_degree`).
        """
        if 0 <= p < self._fits.shape[1]:
            return bool(self._fits[i, p])
        return p <= self.max_p[i] and bool(divides_tensor_degree(self.tensor_degree[i], p))

    def degrees(self, i: int, microbatches: int,
                sample: int | None = None) -> list[tuple[int, int, int]]:
        """Every ``(sample, parameter, attribute)`` unit ``i`` may take (with sample degree
        ``sample`` only, when given: the runnable space's one data-parallel degree); made once
        per unit and arguments."""
        key = (i, microbatches, sample)
        out = self._degrees.get(key)
        if out is None:
            out = self._degrees[key] = [
                (s, p, a) for k in self.part_counts for s, p, a in _factorizations(k)
                if self.fits(i, p) and a <= self.max_a[i] and sample in (None, s) and (
                    not self.batch or (self.batch % s == 0 and s * microbatches <= self.batch))]
        return out

    def sample_degrees(self, microbatches: int) -> list[int]:
        """The data-parallel degrees every unit may take together: device-count divisors that
        split the batch into ``microbatches`` micro-batches per replica.

        >>> import memflow
        >>> from memflow.search.synthetic import chain_graph
        >>> SearchSpace(chain_graph(2, batch=6), memflow.Cluster.preset("4xV100-16GB")
        ...             ).sample_degrees(1)
        [1, 2]
        """
        return [s for s in self.part_counts
                if not self.batch or (self.batch % s == 0 and s * microbatches <= self.batch)]

    def on_replicas(self, strategy, sample: int):
        """``strategy`` with every unit on ``sample`` data-parallel replicas: each unit's
        parameter degree lowered until it fits (``sample × parameter`` parts dividing the
        device count, :meth:`fits`), no attribute split, on the aligned run of devices that
        holds its first device; a unit left unsplit drops sequence parallelism. One pass over
        the arrays (a replicas move changes every unit: per unit, it was a fifth of a search's
        proposing on 175 units).

        >>> import memflow
        >>> from memflow.search.synthetic import chain_graph
        >>> g = chain_graph(2, batch=8)
        >>> sp = SearchSpace(g, memflow.Cluster.preset("4xV100-16GB"), runnable=False)
        >>> s = memflow.Strategy.data_parallel(g, 1).with_config("l1", parameter=4,
        ...                                                      devices=sp.devices)
        >>> r = sp.on_replicas(s, 2)
        >>> r.parameter.tolist(), r.devices
        ([1, 2], (('gpu0', 'gpu1'), ('gpu0', 'gpu1', 'gpu2', 'gpu3')))
        """
        parameter = np.minimum(np.asarray(strategy.parameter, np.int64), self.max_p)
        for p in range(int(parameter.max()), 1, -1):    # each degree that does not fit: one less
            at = parameter == p
            if sample * p in self.part_counts:
                at &= ~divides_tensor_degree(self.tensor_degree, p)
            parameter[at] = p - 1
        parts = sample * parameter
        first = np.array([self._device_index.get(d[0], 0) for d in strategy.devices], np.int64)
        # the run of parts[i] devices holding unit i's first device, one look-up per distinct run
        run = parts * len(self.devices) + first // parts
        runs = {r: self.groups(r // len(self.devices))[r % len(self.devices)]
                for r in set(run.tolist())}
        arrays = dict(sample=np.full(self.n, sample, np.int64), parameter=parameter,
                      attribute=np.ones(self.n, np.int64),
                      sequence_parallel=np.asarray(strategy.sequence_parallel) & (parameter > 1))
        for a in arrays.values():
            a.flags.writeable = False
        return strategy._replace(devices=tuple(map(runs.__getitem__, run.tolist())), **arrays)

    def whole_replicas(self, strategy):
        """``strategy`` as whole-model replicas: every unit on the largest data-parallel
        degree of :meth:`sample_degrees` its devices hold, on the first aligned run of them,
        without pipeline stages, parameter or attribute splits (policies, micro-batches — on
        a schedule export runs with one stage — and model states kept).

        >>> import memflow
        >>> from memflow.search.synthetic import chain_graph
        >>> g = chain_graph(2, batch=8)
        >>> four = memflow.Cluster.preset("4xV100-16GB")
        >>> sp = SearchSpace(g, four)
        >>> w = sp.whole_replicas(memflow.Strategy.pipeline(g, four, stages=2, dp=2,
        ...                                                 microbatches=1))
        >>> w.sample.tolist(), w.stage.tolist(), w.devices[0]
        ([4, 4], [-1, -1], ('gpu0', 'gpu1', 'gpu2', 'gpu3'))
        """
        held = len(set(strategy.device_names))
        sample = max([d for d in self.sample_degrees(strategy.microbatches) if d <= held]
                     or [1])
        return strategy.with_config(self.names, sample=sample, parameter=1, attribute=1,
                                    stage=-1, devices=self.groups(sample)[0])

    def on_exported_schedule(self, strategy):
        """``strategy`` with its micro-batches on a schedule export runs (the first of
        :attr:`RUNNABLE.schedules`) where this space is export's and its own is not (a
        strategy that never had micro-batches may carry any schedule name)."""
        if self.runnable and strategy.microbatches > 1 and \
                strategy.schedule not in RUNNABLE.schedules:
            return strategy.with_schedule(schedule=RUNNABLE.schedules[0])
        return strategy

    def precisions(self, strategy) -> list[str]:
        """The precisions a move may give ``strategy`` (:func:`precision_choices`): in the
        runnable space those export writes, ``amp`` only on a graph holding its program
        (:attr:`amp`)."""
        return [p for p in precision_choices(strategy, self.bf16) if not self.runnable or (
            p in RUNNABLE.precisions and (p != "amp" or self.amp))]

    def runs(self, strategy) -> bool:
        """Whether export runs ``strategy`` within this space's parameter limits."""
        root = np.asarray(strategy.shard)[self.root_sharded]
        stages, _, mixed = parallel_kinds(strategy)     # no stage above 0: no pipeline problem
        return (unrunnable(strategy) is None
                and not (stages and pipeline_problem(strategy, self.graph) is not None)
                and sequence_problem(strategy, self.graph) is None
                and not (mixed and sample_problem(strategy, self.graph) is not None)
                and bool((np.asarray(strategy.parameter) <= self.max_p).all())
                and bool(divides_tensor_degree(self.tensor_degree, strategy.parameter).all())
                and bool((root == root[:1]).all())
                # unrunnable found no model_state_problem: the rest of holds_states
                and self._holds_on_graph(strategy))

    def holds_states(self, strategy) -> bool:
        """Whether export holds ``strategy``'s model states at its precision and optimizer
        place (:func:`~memflow.strategy.runnable.model_state_problem`, the root group's rule
        from this space's cached :func:`~memflow.strategy.runnable.root_sharded`; ``amp`` only
        on a graph holding its program, :attr:`amp`)."""
        return model_state_problem(strategy) is None and self._holds_on_graph(strategy)

    def _holds_on_graph(self, strategy) -> bool:
        """The rules of :meth:`holds_states` that ask this space's graph."""
        if strategy.precision == "amp" and not self.amp:
            return False
        if not strategy.offload_optimizer.any():
            return True     # every optimizer on the device: the root group's one place
        root = np.asarray(strategy.shard)[self.root_sharded]
        place = np.asarray(strategy.offload_optimizer)[self.root_sharded][root >= S_GRADIENTS]
        return bool((place == place[:1]).all())

    def project(self, strategy):
        """``strategy`` moved into the space: unchanged when the space is the full one or it
        runs already; else every unit on the data-parallel degree of its first unit (or the
        largest valid one below it), with :meth:`on_replicas`, micro-batches on a schedule
        export runs, and model states (shard levels, optimizer place, precision) as export
        writes them.

        >>> import memflow
        >>> from memflow.search.synthetic import chain_graph
        >>> g = chain_graph(2, batch=8)
        >>> sp = SearchSpace(g, memflow.Cluster.preset("4xV100-16GB"))
        >>> s = memflow.Strategy.data_parallel(g, 4).with_config("l1", sample=1, devices=["gpu2"])
        >>> sp.project(s) == s      # per-unit sample degrees run (memflow.export.sample_groups)
        True
        >>> sp.project(s.with_schedule(microbatches=2, schedule="gpipe")).devices
        (('gpu0', 'gpu1', 'gpu2', 'gpu3'), ('gpu0', 'gpu1', 'gpu2', 'gpu3'))
        """
        if not self.runnable or self.runs(strategy):
            return strategy
        valid = self.sample_degrees(strategy.microbatches) or [1]
        sample = max([d for d in valid if d <= int(strategy.sample[0])] or [1])
        out = self.on_replicas(strategy, sample)
        out = (out.with_schedule(schedule=RUNNABLE.schedules[0])
               if pipeline_problem(out, self.graph) is not None
               else self.on_exported_schedule(out))
        # model states export does not write yet go back to how the model holds them; the
        # units sharded in the root fully_shard group take the first one's level
        if set(out.shard_levels) - set(RUNNABLE.shard_levels):
            out = out.with_shard(RUNNABLE.shard_levels[0])
        root = [self.names[i] for i in np.flatnonzero(self.root_sharded)]
        if root:
            out = out.with_shard(dict.fromkeys(root, out.shard_levels[self.position[root[0]]]))
        if out.offload_optimizer.any() and not RUNNABLE.offload_optimizer:
            out = out.with_model_states(offload_optimizer=False)
        if out.precision not in RUNNABLE.precisions:
            out = out._replace(precision=RUNNABLE.precisions[0])
        if sequence_problem(out, self.graph) is not None:
            out = without_sequence(out)
        if model_state_problem(out, self.graph) is not None:
            out = out.with_model_states(offload_optimizer=False)._replace(
                precision=RUNNABLE.precisions[0])
        return out

    def groups(self, k: int) -> list[tuple[str, ...]]:
        """The aligned runs of ``k`` devices (made once per ``k``: a replicas move asks for
        them once per unit)."""
        runs = self._groups.get(k)
        if runs is None:
            runs = self._groups[k] = [tuple(self.devices[j:j + k])
                                      for j in range(0, len(self.devices), k)]
        return runs

    def policy_choices(self, i: int) -> list[tuple[int, float]]:
        """``(policy code, error bound)`` pairs unit ``i`` may take."""
        barred = (() if self.recomputable[i] else POLICIES.codes("recompute")) + \
            (() if self.recomputable[i] and self.selective[i] else POLICIES.codes("selective"))
        return [c for c in self._choices if c[0] not in barred] if barred else self._choices

    def admits(self, s) -> bool:
        """Whether every free unit of strategy ``s`` has one of its policy choices (and, in
        the runnable space, export runs ``s``).

        >>> import memflow
        >>> from memflow.search.synthetic import chain_graph
        >>> g = chain_graph(2)
        >>> sp = SearchSpace(g, memflow.Cluster.preset("1xV100-16GB"), policies=("keep",))
        >>> s = memflow.Strategy.single_device(g)
        >>> sp.admits(s), sp.admits(s.with_policy(recompute=["l1"]))
        (True, False)
        """
        return (not self.runnable or self.runs(s)) and all(
            policy_label(int(s.policy[i]), float(s.error_bound[i]))
            in {policy_label(c, e) for c, e in self.policy_choices(i)} for i in self.free())

    def settings(self) -> dict[str, Any]:
        """The constructor arguments, for saving."""
        return {"policies": list(self.policies), "error_bounds": list(self.error_bounds),
                "runnable": self.runnable}


def without_sequence(strategy):
    """``strategy`` with no unit sequence parallel."""
    none = np.zeros(len(strategy), bool)
    none.flags.writeable = False
    return strategy._replace(sequence_parallel=none)


# ---------------------------------------------------------------------- model-state choices
OPTIMIZER_PLACES = ("device", "host")
"""Where a unit's optimizer states and step live (``host``: ZeRO-Offload)."""


def shard_choices(s, i: int) -> list[str]:
    """The shard levels (:data:`~memflow.strategy.SHARD_LEVELS`) unit ``i`` of strategy ``s``
    may move to: every other level where the unit has data-parallel replicas, none otherwise
    (a level over one replica shards nothing).

    >>> import memflow
    >>> from memflow.search.synthetic import chain_graph
    >>> s = memflow.Strategy.data_parallel(chain_graph(2, batch=8), 2)
    >>> shard_choices(s, 0), shard_choices(s.with_config("l0", sample=1, devices=["gpu0"]), 0)
    (['optimizer', 'gradients', 'parameters'], [])
    """
    from ..strategy import SHARD_LEVELS
    if s.sample[i] < 2:
        return []
    return [lv for k, lv in enumerate(SHARD_LEVELS) if k != s.shard[i]]


def precision_choices(s, bf16: bool = True) -> list[str]:
    """The precisions (:data:`~memflow.strategy.PRECISIONS`) other than the one ``s`` sets
    (all of them when it sets none and trains in the simulator's); without ``bf16`` (no
    device of the cluster has bf16 units: :attr:`SearchSpace.bf16`) not the bf16 ones
    (:data:`~memflow.sim.precision.BF16_PRECISIONS`), which would compute at the FP32 rate.

    >>> import memflow
    >>> from memflow.search.synthetic import chain_graph
    >>> s = memflow.Strategy.single_device(chain_graph(2))
    >>> precision_choices(s.with_model_states(precision="fp32"))
    ['amp', 'bf16', 'pure-bf16']
    >>> precision_choices(s.with_model_states(precision="fp32"), bf16=False)
    ['amp']
    """
    from ..strategy import PRECISIONS
    return [p for p in PRECISIONS
            if p != s.precision and (bf16 or p not in BF16_PRECISIONS)]
