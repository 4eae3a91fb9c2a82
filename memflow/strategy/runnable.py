"""What export can run: the one declaration the search and export both read.

FlexFlow's strategy space gives every unit its own degrees over the sample, parameter and
attribute dimensions and any pipeline schedule. PyTorch code runs a subset of it
(``docs/export.md`` says why the rest is out of reach today); :data:`RUNNABLE` states that
subset as data and :func:`unrunnable` gives the first reason a strategy falls outside it,
naming the unit and what would be valid. :mod:`memflow.export` refuses a strategy with that
reason; :class:`~memflow.search.space.SearchSpace` proposes only strategies it accepts (unless
asked for the full space), so what the search finds is what export runs.

The rules of :data:`RUNNABLE`:

* **per-unit data-parallel degrees in groups** — units may have different sample degrees
  (FlexFlow's per-unit "sample" split): each run of consecutive units with the same degree and
  devices is a group that runs on its devices' processes, each with its share of the batch,
  and the activations crossing from one group to the next are re-sharded between them
  (:mod:`memflow.export.sample_groups`). The model is cut between groups as a pipeline is, so a
  boundary must be at a module called once (checked with the graph); groups are not composed
  with parameter splits, shard levels, pipeline stages or micro-batches yet
  (:func:`sample_problem`). One degree for every unit runs as whole-model replicas
  (``DistributedDataParallel``);
* **no attribute splits** — a spatial or sequence split needs halo exchanges between parts;
* **parameter splits only of sliceable units** — a whole module call of a ``Linear``,
  ``Conv*`` with one group or ``Embedding`` (the graph's ``shard_axis``,
  :mod:`memflow.graph.slicing`), up to its ``max_parameter_degree``, or of a block whose
  linears all declare a Megatron ``tp_plan`` (a Llama decoder layer, a GPT-2 or BERT block:
  attention by heads, MLP by hidden units), at a degree dividing its ``tensor_degree``
  (its heads and widths split evenly; validation refuses others), called once,
  whose weights no other module shares;
* **shard levels over data-parallel replicas** — any of ``shard_levels``, written as FSDP2
  ``fully_shard`` per unit and ZeRO-1's ``ZeroRedundancyOptimizer``
  (:mod:`memflow.export.fsdp`) over whole-model replicas, over the tensor-parallel shards
  (as torchtitan composes FSDP2 with DTensor), and over each pipeline stage's replicas (as
  torchtitan composes dp × pp: a stage process per replica, :func:`pipeline_problem`). Units
  whose parameters cannot be a
  ``fully_shard`` group of their own — glue (their module's own code), a module called more
  than once, tied weights (:func:`root_sharded`) — are sharded together at the model's root,
  so they share one level;
* **precision and optimizer place on replicas, pipeline stages and tensor-parallel shards** —
  precisions in ``precisions`` (``bf16``: FSDP2's ``MixedPrecisionPolicy`` or bf16
  parameters with fp32 master copies; ``pure-bf16``; ``amp``: float16 autocast with a loss
  scaler, on whole-model replicas only, :func:`amp_problem`) and
  optimizer offload if ``offload_optimizer`` (FSDP2's ``CPUOffloadPolicy``, or a host copy
  stepped there), written by :mod:`memflow.export.model_states` on whole-model replicas and on
  pipeline stages run a process each, and ``bf16`` on tensor-parallel shards too (not
  ``pure-bf16`` or optimizer offload there yet); ZeRO-1 (``ZeroRedundancyOptimizer``) partitions the states of the
  tensors it steps, so it cannot shard master or host copies: no ``optimizer`` level under
  ``bf16`` or with the optimizer on the host; the root ``fully_shard`` group has one offload
  policy, so the units sharded there at ``gradients`` or ``parameters`` share one optimizer
  place (:func:`model_state_problem`);
* **sequence parallelism on split blocks of the tensor-parallel path** — a unit may be
  ``sequence_parallel`` if it is a block Megatron splits (or a normalization, which
  ``Strategy.tensor_parallel`` splits) whose stream's sequence (dimension 1 of its output)
  its parameter degree divides, and the strategy runs on the tensor-parallel path, which is
  the one that runs it (:mod:`memflow.export.tensor_parallel`): one tensor-parallel group per
  replica, no pipeline stages (a stage's tensor parallelism runs without it), no offloaded or
  compressed split unit and no recomputed split block (the path refuses those, and the
  replicas' path that would run them instead has no sequence parallelism)
  (:func:`sequence_problem`);
* **selective only where it replays** — a unit whose forward writes in place an output of an
  expensive op that selective checkpointing keeps (capture's ``selective_replays``: an
  ``add_`` into a matmul's output, as an LSTM cell does) would be recomputed from the written
  value, so export refuses ``selective`` there (:mod:`memflow.graph.selective`);
* **micro-batches with the schedules in** ``schedules`` — one process runs GPipe (all
  forwards, then all backwards); 1F1B interleaves them across stages, which needs a process
  per stage: ``torch.distributed.pipelining``'s ``Schedule1F1B``
  (:mod:`memflow.export.pipelining`), so a 1F1B strategy must be what that path runs
  (:func:`pipeline_problem`): two stages or more, at least as many micro-batches as stages
  (torch refuses fewer), each stage of each replica on a device of its own — or, with
  parameter splits, on a tensor-parallel group of its own (TP × PP, torchtitan's composition:
  one split degree, a split unit in every stage, unsplit units inside their stage's group:
  :mod:`memflow.strategy.stage_groups`; no offload or compression of a split unit, no
  recomputed split block) —, no attribute split, and stage boundaries at a module called
  once, not before a unit that writes its input in place (checked with the graph:
  :func:`~memflow.strategy.process_paths.uncut`);
  so must a GPipe pipeline whose model states are sharded over its replicas, in bf16 or
  with the optimizer on the host (else its stages would run in one process per replica).
  Stage ``s`` then holds ``min(m, stages - s)`` micro-batches' activations, as memflow's
  schedule (``memflow.sim.pipeline``) charges.

>>> from memflow.strategy import Strategy
>>> s = Strategy(["conv1", "relu"], devices=[("gpu0", "gpu1"), ("gpu0",)], sample=[2, 1])
>>> unrunnable(s) is None         # two groups: conv1 over 2 processes, relu over 1
True
>>> unrunnable(s.with_config("conv1", parameter=2, devices=["gpu0", "gpu1", "gpu2", "gpu3"]))
"unit 'relu' has sample degree 1 but unit 'conv1' has 2, and unit 'conv1' has a parameter split; export runs per-unit sample degrees as groups of processes, not yet composed with tensor parallelism. Valid: one sample degree for every unit, or parameter=1"
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from .policies import POLICIES
from .process_paths import pipeline_problem, sample_groups, sample_problem
from .process_paths import sharing as _sharing
from .sequence_parallel import sequence_problem, sequence_units
from .shard_levels import SHARD_LEVELS, S_GRADIENTS, S_NONE, S_OPTIMIZER

__all__ = ["Runnable", "RUNNABLE", "unrunnable", "parameter_limits", "why_unsliceable",
           "root_sharded", "shard_problem", "pipeline_problem",
           "model_state_problem", "amp_problem", "parallel_kinds", "runs_amp", "sample_problem",
           "sample_groups", "sequence_problem", "sequence_units"]


@dataclass(frozen=True)
class Runnable:
    """The strategy features export runs (see the module docstring for the reasons)."""

    per_unit_sample: bool = True
    """Units may have different sample degrees (groups of processes, :func:`sample_problem`);
    False: every unit the same degree (whole-model data-parallel replicas only)."""
    max_attribute: int = 1
    """Largest attribute (spatial / sequence) degree."""
    schedules: tuple[str, ...] = ("gpipe", "1f1b")
    """Pipeline schedules export runs with more than one micro-batch."""
    shard_levels: tuple[str, ...] = SHARD_LEVELS
    """Shard levels export writes (:mod:`memflow.export.fsdp`: FSDP2 and ZeRO-1)."""
    precisions: tuple[str | None, ...] = (None, "fp32", "bf16", "pure-bf16", "amp")
    """Strategy precisions export writes (None and ``fp32``: the model's own dtype)."""
    offload_optimizer: bool = True
    """Whether export runs optimizer states and steps on the host."""
    sequence_parallel: bool = True
    """Whether the search may set sequence parallelism, where export runs it: on split
    Megatron blocks on the tensor-parallel path (:func:`sequence_problem`)."""


RUNNABLE = Runnable()


def why_unsliceable(graph, i: int, sharing=None) -> str | None:
    """Why unit ``i`` of ``graph`` cannot have a parameter split in export (None: it can).

    >>> import memflow
    >>> g = memflow.zoo.graph("chain", batch_size=4, n=2, width=8)
    >>> why_unsliceable(g, 0), why_unsliceable(g, 1)
    (None, "unit 'layers.0.relu' is a ReLU; export slices only Linear, Conv1d/2d/3d with one group and Embedding modules, and blocks whose linears declare a Megatron tp_plan")
    """
    u = graph.units
    name = graph.names[i]
    if u["role"].iat[i] != "module":
        return f"unit {name!r} is glue (its module's own code), which export cannot slice"
    if int(u["shard_axis"].iat[i]) < 0 and int(u["tensor_degree"].iat[i]) < 1:
        return (f"unit {name!r} is a {u['kind'].iat[i]}; export slices only Linear, "
                "Conv1d/2d/3d with one group and Embedding modules, and blocks whose "
                "linears declare a Megatron tp_plan")
    calls, tied = sharing or _sharing(graph)
    if calls.get(u["module"].iat[i], 1) > 1:
        return (f"unit {name!r}: its module runs {calls[u['module'].iat[i]]} times in a step; "
                "export slices a module by replacing it, which needs a module called once")
    if name in tied:
        return (f"unit {name!r} shares its weight {tied[name]!r} with another module (tied "
                "weights); slicing it would untie them")
    return None


def parameter_limits(graph) -> np.ndarray:
    """Per unit, the largest parameter degree export runs: ``max_parameter_degree`` where the
    unit can be sliced (:func:`why_unsliceable`) — for a block Megatron splits, its
    ``tensor_degree`` (heads and widths divide among the ranks) —, else 1.

    >>> import memflow
    >>> parameter_limits(memflow.zoo.graph("chain", batch_size=4, n=2, width=8)).tolist()
    [8, 1, 8, 1]
    >>> from memflow.zoo.llama import TINY      # 4 heads, 2 key/value heads
    >>> parameter_limits(memflow.zoo.graph("tinyllama-1.1b", batch_size=2, units="blocks",
    ...                                    **TINY)).tolist()
    [32, 1, 2, 2, 1, 97]
    """
    u = graph.units
    top = np.where(u["shard_axis"].to_numpy() < 0, u["tensor_degree"].to_numpy(np.int64),
                   u["max_parameter_degree"].to_numpy(np.int64))
    sharing = _sharing(graph)
    return np.array([top[i] if why_unsliceable(graph, i, sharing) is None else 1
                     for i in range(len(top))], np.int64)


def root_sharded(graph) -> np.ndarray:
    """Per unit, whether its parameters are sharded in the model's root ``fully_shard`` group
    rather than a group of its own: a glue unit (its module's own parameters), a module called
    more than once, or a unit that reads a weight another unit reads too (tied weights, or a
    parent's code reading its child's weight). Units without parameters are False.

    >>> import memflow
    >>> g = memflow.zoo.graph("gpt2", batch_size=2, vocab=40, max_positions=16, hidden=16,
    ...                       n_layer=1, n_head=2, seq_len=6)
    >>> [n for n, r in zip(g.names, root_sharded(g)) if r]     # the tied embedding and head
    ['wte', 'lm_head']
    """
    u = graph.units
    calls, _ = _sharing(graph)
    index = {name: i for i, name in enumerate(graph.names)}
    out = np.zeros(len(u), bool)
    for readers, buffer in zip(graph.parameters["readers"], graph.parameters["is_buffer"]):
        if buffer:
            continue
        alone = len(readers) == 1 and u["role"].iat[index[readers[0]]] == "module" \
            and calls.get(u["module"].iat[index[readers[0]]], 1) == 1
        if not alone:
            out[[index[r] for r in readers]] = True
    return out


def shard_problem(strategy, graph) -> str | None:
    """Why export cannot shard ``strategy``'s model states as it asks (None: it can); the
    root-group rule is checked only with ``graph``.

    >>> import memflow
    >>> from memflow.strategy import Strategy
    >>> g = memflow.zoo.graph("gpt2", batch_size=2, vocab=40, max_positions=16, hidden=16,
    ...                       n_layer=1, n_head=2, seq_len=6)
    >>> s = Strategy.data_parallel(g, 2)
    >>> shard_problem(s.with_shard({"wte": "parameters"}), g)[:60]
    "unit 'lm_head' has shard level 'none' but unit 'wte' has 'pa"
    """
    levels = strategy.shard
    if int(strategy.sample[0]) < 2 or not (levels != S_NONE).any():
        return None     # one replica: a level shards nothing, the model runs as it is
    units = list(strategy.units)     # the messages below only: this runs on every proposal
    if graph is not None:
        root = np.flatnonzero(root_sharded(graph))
        odd = [i for i in root if levels[i] != levels[root[0]]]
        if odd:
            a, b = units[int(root[0])], units[int(odd[0])]
            return (f"unit {b!r} has shard level {SHARD_LEVELS[levels[odd[0]]]!r} but unit "
                    f"{a!r} has {SHARD_LEVELS[levels[root[0]]]!r}; both are sharded in the "
                    "model's root fully_shard group (glue, a module called more than once, or "
                    f"a shared weight), which has one level. Valid: one level for "
                    f"{', '.join(units[int(i)] for i in root)}")
    return None


def runs_amp(graph) -> bool:
    """Whether the memory model knows ``graph``'s ``amp`` program: capture's amp pass
    (``graph.amp``), or a capture under autocast (its own program); True without a graph."""
    return graph is None or getattr(graph, "amp", None) is not None or \
        bool(graph.meta.get("autocast"))


def parallel_kinds(strategy) -> tuple[bool, bool, bool]:
    """Whether ``strategy`` has pipeline stages (a stage above 0), parameter splits and
    per-unit sample degrees: several rules ask, for every proposal a search checks, so they
    are found once per strategy (kept in its cache).

    >>> from memflow.strategy import Strategy
    >>> parallel_kinds(Strategy(["a", "b"], devices=[("gpu0", "gpu1"), ("gpu0",)], sample=[2, 1]))
    (False, False, True)
    """
    hit = strategy._cache.get("parallel_kinds")
    if hit is None:
        sample = np.asarray(strategy.sample)
        hit = strategy._cache["parallel_kinds"] = (
            bool((np.asarray(strategy.stage) > 0).any()),
            bool((np.asarray(strategy.parameter) > 1).any()), bool((sample != sample[0]).any()))
    return hit


def amp_problem(strategy, graph=None) -> str | None:
    """Why export cannot run ``strategy``'s ``amp`` precision (None: it can, or the precision
    is another). The training loop runs the forward and loss under autocast and steps through
    a loss scaler (:mod:`memflow.export.amp`) on whole-model replicas — one process, or
    DistributedDataParallel, FSDP2 and ZeRO-1 over them, gradient accumulation —, not yet in
    the processes of pipeline stages, tensor-parallel shards or sample groups. With ``graph``,
    the graph must hold the amp program (:func:`runs_amp`): halving an fp32 capture misses
    autocast's weight copies and fp32 ops, so the run would not hold what was predicted.

    >>> from memflow.strategy import Strategy
    >>> s = Strategy(["a", "b"], devices=[("gpu0", "gpu1")] * 2, sample=[2, 2], precision="amp")
    >>> amp_problem(s) is None, amp_problem(s.with_config("b", stage=1))[:63]
    (True, "precision 'amp' in a strategy with pipeline stages: export runs")
    """
    if strategy.precision != "amp":
        return None
    where = next((what for what, found in zip(
        ("pipeline stages", "parameter splits", "per-unit sample degrees"),
        parallel_kinds(strategy)) if found), None)
    if where is not None:
        return (f"precision 'amp' in a strategy with {where}: export runs autocast and its "
                "loss scaler on whole-model replicas (one process, DistributedDataParallel, "
                "FSDP2, ZeRO-1), not yet in the processes of pipeline stages, tensor-parallel "
                f"shards or sample groups. Valid: no {where}, or precision None, 'fp32' or "
                "'bf16'")
    if not runs_amp(graph):
        return (f"precision 'amp' on graph {graph.meta.get('model', '')!r}, captured without "
                "its amp pass (memflow.from_torch(amp=False), a graph built by hand, or a model "
                "that does not run under float16 autocast): the memory of its autocast program "
                "is unknown. Valid: a graph captured with amp=True, or another precision")
    return None


def model_state_problem(strategy, graph=None) -> str | None:
    """Why export cannot hold ``strategy``'s model states at its precision and optimizer place
    (None: it can); the root-group rule is checked only with ``graph``.

    >>> from memflow.strategy import Strategy
    >>> s = Strategy(["a", "b"], devices=[("gpu0", "gpu1")] * 2, sample=[2, 2],
    ...              precision="bf16")
    >>> model_state_problem(s) is None, model_state_problem(s.with_shard({"b": "optimizer"}))[:64]
    (True, "unit 'b' has shard level 'optimizer' with fp32 master weights (p")
    """
    problem = amp_problem(strategy, graph)
    if problem is not None:
        return problem
    offload = np.asarray(strategy.offload_optimizer)
    masters = strategy.precision == "bf16"
    host = bool(offload.any())
    if not (masters or host or strategy.precision == "pure-bf16"):
        return None
    units = strategy.units
    what = (f"precision {strategy.precision!r}" if strategy.precision in ("bf16", "pure-bf16")
            else f"unit {units[int(offload.argmax())]!r} with its optimizer on the host")
    stages, splits, mixed = parallel_kinds(strategy)
    if stages:     # needs a process per stage and replica
        problem = pipeline_problem(strategy, graph)
        if problem is not None:
            return problem
    # parameter splits: bf16 runs on tensor-parallel processes (fp32 masters or FSDP2's
    # MixedPrecisionPolicy over the shards, memflow.export.multiprocess); pure-bf16 and
    # optimizer offload there are not tested yet
    if splits and not (masters and not host):
        return (f"{what} in a strategy with parameter splits: export writes mixed precision "
                "and optimizer offload on whole-model replicas and pipeline stages "
                "(DistributedDataParallel, FSDP2), and precision 'bf16' on tensor-parallel "
                "processes. Valid: precision None, 'fp32' or 'bf16' with the optimizer on the "
                "device, or no parameter splits")
    if mixed:     # the sample-group path never applies shard_model
        return (f"{what} in a strategy with per-unit sample degrees: export writes mixed "
                "precision and optimizer offload on whole-model replicas, not yet on groups "
                "of processes of different degrees. Valid: precision None or 'fp32' and the "
                "optimizer on the device, or one sample degree for every unit")
    if int(strategy.sample[0]) < 2:
        return None
    levels = np.asarray(strategy.shard)
    for i in np.flatnonzero(levels == S_OPTIMIZER):
        if masters or offload[i]:
            copy = ("fp32 master weights (precision 'bf16')" if masters
                    else "its optimizer on the host")
            return (f"unit {units[int(i)]!r} has shard level 'optimizer' with {copy}; "
                    "ZeroRedundancyOptimizer partitions the states of the tensors it steps, "
                    "not master or host copies of them. Valid: shard level 'none', "
                    "'gradients' or 'parameters' for it, or precision 'pure-bf16' with its "
                    "optimizer on the device")
    if graph is not None:
        root = np.flatnonzero(root_sharded(graph) & (levels >= S_GRADIENTS))
        if len(root) and len(set(offload[root].tolist())) > 1:
            return (f"units {', '.join(units[int(i)] for i in root)} are sharded in the model's "
                    "root fully_shard group, which has one offload policy, but only some of "
                    "them have their optimizer on the host. Valid: one optimizer place for them")
    return None


@functools.lru_cache(maxsize=None)
def _written(levels: tuple[str, ...]) -> np.ndarray:
    """Per shard level code, whether it is one of ``levels`` (made once, not per check)."""
    written = np.array([lv in levels for lv in SHARD_LEVELS])
    written.flags.writeable = False
    return written


def unrunnable(strategy, graph=None, rules: Runnable = RUNNABLE) -> str | None:
    """The first reason export cannot run ``strategy``, naming the unit and what is valid;
    None when it can. Parameter splits are checked only with the ``graph`` the strategy was
    made for (it tells which units can be sliced)."""
    units = list(strategy.units)
    sample = np.asarray(strategy.sample)
    odd = np.flatnonzero(sample != sample[0])
    if len(odd):
        i = int(odd[0])
        mixed = (f"unit {units[i]!r} has sample degree {int(sample[i])} but unit "
                 f"{units[0]!r} has {int(sample[0])}")
        if not rules.per_unit_sample:
            return (f"{mixed}; export runs data parallelism as whole-model replicas "
                    "(DistributedDataParallel), so every unit needs the same sample degree")
        problem = sample_problem(strategy, graph)
        if problem is not None:
            return f"{mixed}, and {problem}"
    wide = np.flatnonzero(np.asarray(strategy.attribute) > rules.max_attribute)
    if len(wide):
        i = int(wide[0])
        return (f"unit {units[i]!r} is split {int(strategy.attribute[i])} ways over its "
                "attribute (spatial or sequence) dimension; export cannot generate the halo "
                f"exchanges this needs. Valid: attribute <= {rules.max_attribute}, with sample "
                "or parameter splits")
    if strategy.microbatches > 1 and strategy.schedule not in rules.schedules:
        return (f"schedule {strategy.schedule!r} with {strategy.microbatches} micro-batches: "
                f"export supports schedule={' or '.join(map(repr, rules.schedules))}")
    # pipeline_problem finds none without a stage above 0 (parallel_kinds is cached)
    problem = pipeline_problem(strategy, graph) if parallel_kinds(strategy)[0] else None
    if problem is not None:
        return problem
    written = _written(tuple(rules.shard_levels))
    odd = np.flatnonzero(~written[strategy.shard])
    if len(odd):
        levels = strategy.shard_levels
        return (f"unit {units[odd[0]]!r} has shard level {levels[odd[0]]!r}; export does not "
                "write it. Valid: shard level "
                f"{' or '.join(map(repr, rules.shard_levels))}")
    problem = shard_problem(strategy, graph)
    if problem is not None:
        return problem
    offload = strategy.offload_optimizer
    if offload.any() and not rules.offload_optimizer:
        return (f"unit {units[int(offload.argmax())]!r} has its optimizer on the host; export "
                "does not run optimizer offload. Valid: the optimizer on the device")
    seq = np.asarray(strategy.sequence_parallel)
    if seq.any() and not rules.sequence_parallel:
        return (f"unit {units[int(seq.argmax())]!r} is sequence parallel, which these rules "
                "exclude. Valid: sequence_parallel=False")
    problem = sequence_problem(strategy, graph)
    if problem is not None:
        return problem
    if strategy.precision not in rules.precisions:
        return (f"precision {strategy.precision!r}: export does not write it. Valid: precision "
                f"{', '.join(map(repr, rules.precisions))}")
    problem = model_state_problem(strategy, graph)
    if problem is not None:
        return problem
    if graph is not None:
        stuck = np.flatnonzero(POLICIES.selective(strategy.policy)
                               & ~graph.units["selective_replays"].to_numpy(bool))
        if len(stuck):
            return (f"unit {units[int(stuck[0])]!r} writes in place an output of an expensive "
                    "op that selective checkpointing keeps (an add_ into a matmul's output, as "
                    "an LSTM cell does), so its recomputation would read the written value. "
                    "Valid: any other policy for it (keep, recompute, offload, compress)")
        parameter = np.asarray(strategy.parameter)
        limits = parameter_limits(graph)
        for i in np.flatnonzero(parameter > 1):
            why = why_unsliceable(graph, int(i))
            if why is not None or parameter[i] > limits[i]:
                most = f"unit {units[i]!r} splits at most {int(limits[i])} ways"
                return (f"{why or most}, so its "
                        f"parameter split of {int(parameter[i])} cannot run. Valid: "
                        f"parameter <= {1 if why else int(limits[i])}")
    return None

