"""Pipeline stages across processes: a staged strategy run by ``torch.distributed.pipelining``.

A strategy whose units carry pipeline stages (``Strategy.stage``) runs one stage per process:
the model is cut at the units' stage boundaries by pipelining's tracer (``pipeline(model,
micro-batch, split_spec=...)``), each process wraps its stage's module in a
``PipelineStage`` and runs ``ScheduleGPipe`` or ``Schedule1F1B`` (``strategy.schedule``) with
``strategy.microbatches`` micro-batches and the training loss as the schedule's ``loss_fn``;
``schedule.step(inputs, target=...)`` is one training step.

Why the tracer rather than stage modules built from the units' spans: a span of *glue* (a
module's own code between its children's calls, e.g. GPT-2's embedding sum) is Python inside
the parent's ``forward``; only a trace can cut it out. ``torch.export`` traces every zoo model
(CNNs, ResNets with their skip connections, GPT-2 with its tied head), and the traced stage
keeps the model's module hierarchy, so memflow's own hooks (:func:`memflow.export.apply`) run
each stage's memory policies — recompute, offload, compress — exactly as on one device.

Rules (each refusal is an :class:`~memflow.errors.ExportError` naming the unit):

* a stage boundary must be a module call: the first unit of a stage is a module unit (split
  at its beginning) or the last unit of the stage before it is (split at its end), and that
  module is called once per forward;
* every unit of a stage of one replica is on one device, unsplit (``attribute`` 1 always),
  or the stage's units are split over one tensor-parallel group of ``t`` devices
  (:mod:`memflow.export.stage_tensor`: ``replicas × stages × t`` processes), and every unit
  has the same sample degree (the replicas);
* the traced stages have fixed shapes: the micro-batches must divide each replica's batch.

Ranks. The process grid is a ``replicas × stages`` ``DeviceMesh`` (``("dp", "pp")``, as
torchtitan lays out dp × pp); rank ``r * stages + s`` runs stage ``s`` of replica ``r`` (the
strategy's devices of that stage and replica name it; the mapping is :func:`stage_ranks`). The
stages of a replica form its pipeline group (point-to-point sends); stage ``s`` of every
replica forms a data-parallel group. A weight used by two stages (GPT-2's tied embedding and
head) is replicated by the tracer; its gradients are summed over the stages that hold it.

Model states. Each stage holds its units' model states over its data-parallel group as a
whole-model replica does (:func:`memflow.export.fsdp.shard_model` on the ``dp`` sub-mesh):
units at shard level ``parameters`` or ``gradients`` are FSDP2 ``fully_shard`` groups, ZeRO-1
partitions optimizer states, the rest are averaged after each step (:meth:`PipelineRun.step`);
``bf16`` casts (FSDP2's ``MixedPrecisionPolicy``, else bf16 parameters stepped through fp32
masters), the optimizer steps on the host where the units say. The stage handed to
``PipelineStage`` is memflow's wrapper around the FSDP2 root (it runs the memory policies),
so the schedule does not switch FSDP2's gradient sync off between micro-batches as it does
for torchtitan, whose stage *is* the FSDP2 module: each micro-batch's backward
reduce-scatters its gradients into the shards and reshards. That is one reduce-scatter per
micro-batch rather than per step, and no unsharded gradient or gathered weight outlives a
micro-batch's backward.

>>> from memflow.strategy import Strategy
>>> s = Strategy(["0", "1", "2"], devices=[("gpu0", "gpu2"), ("gpu1", "gpu3"), ("gpu1", "gpu3")],
...              sample=[2, 2, 2], stage=[0, 1, 1], microbatches=2, schedule="gpipe")
>>> stage_ranks(s)
{'gpu0': 0, 'gpu1': 1, 'gpu2': 2, 'gpu3': 3}
>>> split_points(s)
{'1': 'beginning'}
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from ..errors import ExportError
from ..graph.units import LOSS, ROOT
from ..strategy.shard_levels import S_NONE
from .fsdp import shard_model
from .grad_flow import constant_inputs, detach_constants
from .model_states import cast_inputs, cast_statistics, compute_dtype
from .spans import unit_spans
from .stage_tensor import parallelize_stage, stage_groups, stage_plan, stage_tensor_degree

__all__ = ["stages", "stage_ranks", "split_points", "stage_strategy", "trace", "traced_stage",
           "stage_modules",
           "PipelineRun", "build_pipeline", "average_gradients"]


def stages(strategy) -> int:
    """The number of pipeline stages (1 for a strategy without stages).

    >>> from memflow.strategy import Strategy
    >>> stages(Strategy(["a", "b"], devices=[("gpu0",), ("gpu1",)], stage=[0, 1]))
    2
    """
    return int(strategy.stage.max()) + 1 if (strategy.stage >= 0).any() else 1


def _check(strategy) -> tuple[int, int]:
    """(replicas, stages), after the rules of the module docstring."""
    first = int(strategy.sample[0])
    n = stages(strategy)
    for i, u in enumerate(strategy.units):
        if int(strategy.sample[i]) != first:
            raise ExportError(f"unit {u!r} has sample degree {int(strategy.sample[i])} but unit "
                              f"{strategy.units[0]!r} has {first}; a pipeline runs whole "
                              "replicas of its stages, so every unit needs the same sample degree")
        if int(strategy.attribute[i]) > 1:
            raise ExportError(f"unit {u!r} is split over its attribute dimension inside a "
                              "pipeline stage; export runs a stage on one device, or one "
                              "tensor-parallel group, per replica. Valid: attribute=1")
    if sorted(set(strategy.stage.tolist())) != list(range(n)):
        raise ExportError(f"the strategy's stages are {sorted(set(strategy.stage.tolist()))}; "
                          f"export needs every stage 0..{n - 1} to hold a unit")
    return first, n


def stage_ranks(strategy) -> dict[str, int]:
    """The rank of each device: ``replica * stages + stage`` of the units it runs.

    A device that runs units of two stages or two replicas is refused: each stage of each
    replica is one process.
    """
    replicas, n = _check(strategy)
    t = stage_tensor_degree(strategy)
    if t > 1:       # rank (r * n + s) * t + k: device k of stage s's group in replica r
        ranks = {d: (r * n + s) * t + k for (r, s), group in stage_groups(strategy).items()
                 for k, d in enumerate(group)}
        if len(set(ranks.values())) != len(ranks) or len(ranks) != replicas * n * t:
            raise ExportError("a device runs two stages or replicas of a pipeline with "
                              "tensor-parallel stages; give each stage of each replica its "
                              f"own {t} devices")
        return dict(sorted(ranks.items(), key=lambda kv: kv[1]))
    ranks: dict[str, int] = {}
    for i, u in enumerate(strategy.units):
        for r, device in enumerate(strategy.devices[i]):
            rank = r * n + int(strategy.stage[i])
            if ranks.setdefault(device, rank) != rank:
                raise ExportError(
                    f"unit {u!r}: device {device!r} runs stage {int(strategy.stage[i])} of "
                    f"replica {r} but also another stage or replica; a pipeline runs each stage "
                    "of each replica on its own device")
    return dict(sorted(ranks.items(), key=lambda kv: kv[1]))


def split_points(strategy, graph=None) -> dict[str, str]:
    """Where the model is cut: module path -> ``"beginning"`` or ``"end"`` (of its call)."""
    spans = unit_spans(strategy.units, graph)
    calls: dict[str, int] = {}
    for s in spans:
        calls[s.module] = max(calls.get(s.module, 0), s.call)
    points = {}
    stage = strategy.stage
    for i in np.flatnonzero(np.diff(stage) != 0).tolist():
        before, after = spans[i], spans[i + 1]
        for span, where in ((after, "beginning"), (before, "end")):
            if (span.role == "module" and span.module not in (ROOT, LOSS)
                    and calls[span.module] == 1):
                points[span.module] = where
                break
        else:
            raise ExportError(
                f"unit {after.name!r} starts stage {int(stage[i + 1])} after unit "
                f"{before.name!r}, but neither is a module called once: the cut would fall "
                "inside a module's own code. Move the stage boundary next to a module unit")
    return points


def stage_strategy(strategy, stage: int):
    """The units of ``stage`` with their memory policies, shard levels and optimizer place and
    the strategy's precision, on one device ``"stage"``: what :func:`memflow.export.apply` runs
    inside the stage's process, and :func:`~memflow.export.fsdp.shard_model` shards over the
    stage's replicas."""
    from ..strategy import Strategy     # a value object: export builds one for a stage
    keep = np.flatnonzero(strategy.stage == stage)
    units = [strategy.units[i] for i in keep if strategy.units[i] != LOSS]
    keep = np.array([i for i in keep if strategy.units[i] != LOSS], dtype=np.int64)
    return Strategy(units, devices=[("stage",)] * len(units), policy=strategy.policy[keep],
                    error_bound=strategy.error_bound[keep],
                    segment_break=strategy.segment_break[keep], shard=strategy.shard[keep],
                    offload_optimizer=strategy.offload_optimizer[keep],
                    precision=strategy.precision, name=f"{strategy.name} stage {stage}")


@contextlib.contextmanager
def _traceable(model: nn.Module):
    """The model as the tracer needs it, and as it was afterwards.

    Every buffer is persistent while tracing: the tracer gives a stage its buffers from the
    state dict, so a non-persistent buffer shared by modules of two stages (GPT-2's causal
    mask) would otherwise reach only the first. The split markers the tracer puts on modules'
    ``forward`` are taken off again, so the model can be traced anew.
    """
    saved = {m: set(m._non_persistent_buffers_set) for m in model.modules()}
    for m in saved:
        m._non_persistent_buffers_set.clear()
    try:
        yield
    finally:
        for m, names in saved.items():
            m._non_persistent_buffers_set.update(names)
            if "_orig_forward" in vars(m):
                del m.forward, m._orig_forward


@contextlib.contextmanager
def _computing(model: nn.Module, precision: str | None):
    """The model in ``precision``'s compute dtype while it is traced, its parameters as they
    were afterwards (yields their tensors by every name, ``{}`` without a cast).

    The trace is specialised to the dtypes it sees: a ``.to(torch.float32)`` of an fp32
    activation (Llama's RMSNorm upcast) is traced as a dtype check, not a cast, so a stage
    traced in fp32 refuses (or would not upcast) the bf16 activations it gets under a bf16
    precision. Traced in bf16, the stage casts where the model casts. The parameters go back
    to their own dtype: they are the fp32 masters FSDP2 shards, or are cast again by
    :func:`~memflow.export.model_states.cast_parameters`. Batch norms' running statistics
    stay in bf16 (:func:`~memflow.export.model_states.cast_statistics`)."""
    dtype = compute_dtype(precision)
    if dtype is None:
        yield {}
        return
    cast_statistics(model, precision)
    masters = {n: p.data for n, p in model.named_parameters(remove_duplicate=False)}
    saved = [(p, p.data) for p in model.parameters()]
    for p, data in saved:
        if p.is_floating_point():
            p.data = data.to(dtype)
    try:
        yield masters
    finally:
        for p, data in saved:
            p.data = data


def _drop_unused(stage: nn.Module) -> None:
    """Remove what the stage's graphs never read: the tracer also leaves copies of a tied
    weight under its other names (GPT-2's ``lm_head.weight`` beside ``wte.weight``), which
    would hold memory and reach the optimizer without a gradient."""
    used: set[str] = set()
    for path, m in stage.named_modules():
        graph = getattr(m, "graph", None)
        for node in graph.nodes if isinstance(graph, torch.fx.Graph) else ():
            if node.op == "get_attr":
                used.add(f"{path}.{node.target}" if path else str(node.target))
    for name in [n for n, _ in stage.named_parameters(remove_duplicate=False)] + \
            [n for n, _ in stage.named_buffers(remove_duplicate=False)]:
        if name not in used:
            owner, _, attr = name.rpartition(".")
            delattr(stage.get_submodule(owner), attr)


def average_gradients(module: nn.Module, group) -> None:
    """Average ``module``'s gradients over the data-parallel ``group`` (each rank of it holds
    the same parameters, or the same shards of them: a DTensor's local shard is averaged)."""
    world = dist.get_world_size(group)
    for p in module.parameters():
        if p.grad is not None:
            grad = getattr(p.grad, "_local_tensor", p.grad)
            dist.all_reduce(grad, group=group)
            grad /= world


@dataclass
class PipelineRun:
    """This process's stage of a pipelined strategy: ``module`` (the stage, running its memory
    policies, its model states as :func:`~memflow.export.fsdp.shard_model` holds them over the
    stage's replicas: ``sharding``), ``schedule`` and the groups of its tied weights."""

    module: nn.Module
    stage: Any
    schedule: Any
    index: int
    replica: int
    sharding: Any
    tied: list[tuple[nn.Parameter, Any]]

    @property
    def is_last(self) -> bool:
        return self.stage.is_last

    def step(self, args: tuple, kwargs: dict, target: torch.Tensor | None) -> torch.Tensor | None:
        """One training step (forward and backward of every micro-batch); the mean loss of the
        micro-batches on the last stage, None elsewhere. Gradients are then complete: tied
        weights summed over their stages, every stage averaged over the replicas (FSDP2
        reduce-scatters its groups' gradients in each micro-batch's backward; the rest are
        averaged here)."""
        losses: list[torch.Tensor] = []
        args, kwargs = self.sharding.inputs((args, kwargs))     # bf16 under a bf16 precision
        self.schedule.step(*(args if self.stage.is_first else ()),
                           **(kwargs if self.stage.is_first else {}),
                           target=target if self.is_last else None, losses=losses)
        for param, group in self.tied:
            if param.grad is not None:      # a sharded weight's shards line up on every stage
                dist.all_reduce(getattr(param.grad, "_local_tensor", param.grad), group=group)
        self.sharding.after_backward()
        return torch.stack([l.detach() for l in losses]).mean() if losses else None

    def optimizer(self, cls: type, **options: Any):
        """The stage's optimizer (:meth:`~memflow.export.fsdp.Sharding.optimizer`)."""
        return self.sharding.optimizer(cls, **options)


def trace(model: nn.Module, strategy, example: tuple[tuple, dict], graph=None):
    """The tracer's ``Pipe`` of ``model`` cut at ``strategy``'s stage boundaries, from
    ``example`` (``(args, kwargs)`` of one replica's batch) cut into the strategy's
    micro-batches; its ``split_gm`` is the program between the stages."""
    from torch.distributed.pipelining import SplitPoint, pipeline

    _, n = _check(strategy)
    args, kwargs = example
    m = strategy.microbatches
    batch = next((t.shape[0] for t in [*args, *kwargs.values()] if isinstance(t, torch.Tensor)),
                 None)
    if batch is None or batch % m:
        raise ExportError(f"{m} micro-batches do not divide the replica's batch of {batch}: "
                          "the traced stages have fixed shapes; use a batch that is a "
                          f"multiple of {m}")
    split = {path: SplitPoint.BEGINNING if where == "beginning" else SplitPoint.END
             for path, where in split_points(strategy, graph).items()}
    micro = [t[:batch // m] if isinstance(t, torch.Tensor) else t for t in args]
    micro_kw = {k: t[:batch // m] if isinstance(t, torch.Tensor) else t
                for k, t in kwargs.items()}
    micro, micro_kw = cast_inputs((tuple(micro), micro_kw), strategy.precision)
    with _traceable(model), _computing(model, strategy.precision) as masters:
        pipe = pipeline(model, micro, micro_kw, split_spec=split)
    for i in range(pipe.num_stages):    # the tracer's copies of tied weights, made in bf16
        for name, p in pipe.get_stage_module(i).named_parameters(remove_duplicate=False):
            if name in masters and p.dtype != masters[name].dtype:
                p.data = masters[name].clone()
    if pipe.num_stages != n:
        raise ExportError(f"the trace of the model gave {pipe.num_stages} stages where the "
                          f"strategy has {n}; split points: {split_points(strategy, graph)}")
    return pipe


def traced_stage(pipe, strategy, index: int, device: torch.device | str = "cpu",
                 tensor: tuple | None = None):
    """Stage ``index`` of the traced ``pipe``, running its units' memory policies (an
    :class:`~memflow.export.Exported` module); ``tensor``: ``(model, plan, mesh)`` to shard
    its split units on its tensor-parallel group first
    (:func:`~memflow.export.stage_tensor.parallelize_stage`)."""
    from .exported import apply
    module = pipe.get_stage_module(index)
    _drop_unused(module)
    # what it receives that the model computes without grad stays so (pipelining would make
    # it require grad: more saved, memflow.export.grad_flow)
    detach_constants(module, constant_inputs(pipe).get(index, []))
    if tensor is not None:
        parallelize_stage(module, *tensor)
    return apply(module, stage_strategy(strategy, index), inplace=True,
                 devices={"stage": device})


def stage_modules(model: nn.Module, strategy, example: tuple[tuple, dict], *,
                  device: torch.device | str = "cpu", graph=None):
    """The stages of ``strategy`` traced from ``model``, each running its units' memory
    policies (:func:`traced_stage`), and the tracer's tied weights (``[{stage module name:
    weight name there}]``); no process group is needed.

    ``example`` is ``(args, kwargs)`` of one replica's batch, cut into the strategy's
    micro-batches for the trace.
    """
    stage_ranks(strategy)       # one device per stage and replica
    pipe = trace(model, strategy, example, graph)
    return ([traced_stage(pipe, strategy, i, device) for i in range(pipe.num_stages)],
            pipe.replicated_params)


def build_pipeline(model: nn.Module, strategy, example: tuple[tuple, dict], *, rank: int,
                   loss_fn: Callable, device: torch.device | str = "cpu",
                   graph=None) -> PipelineRun:
    """This rank's :class:`PipelineRun` of ``strategy``; every rank of the default process
    group calls it (the groups are made collectively).

    ``model`` is the whole model (each rank traces it, then keeps its stage:
    :func:`stage_modules`); ``example`` is ``(args, kwargs)`` of one replica's batch;
    ``loss_fn(output, target)`` the training loss.
    """
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    replicas, n = _check(strategy)
    stage_ranks(strategy)       # one device per stage and replica, or one group of t
    t = stage_tensor_degree(strategy)
    pipe = trace(model, strategy, example, graph)
    world = dist.get_world_size()
    if world != replicas * n * t:
        raise ExportError(f"the strategy has {replicas} replicas × {n} stages"
                          + (f" × {t} tensor-parallel ranks" if t > 1 else "")
                          + f" = {replicas * n * t} processes; {world} are running")
    replica, index, part = rank // (n * t), rank // t % n, rank % t
    # the process groups: every rank creates every group, in the same order. Rank
    # (r * n + s) * t + k is (replica r, stage s, tensor rank k) of a replicas × stages × t
    # mesh, as torchtitan lays out dp × pp × tp
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh(torch.device(device).type, (replicas, n, t),
                            mesh_dim_names=("dp", "pp", "tp"))
    tensor = ((model, stage_plan(model, strategy, graph), mesh["tp"]) if t > 1 else None)
    exported = traced_stage(pipe, strategy, index, device, tensor)
    replicated = pipe.replicated_params
    del pipe            # the other stages' modules (their weights) are this rank's no more
    tied = []
    for mapping in replicated:      # stage module name -> the weight's name there
        holders = sorted(int(k.rsplit("_", 1)[1]) for k in mapping)
        groups = {(r, k): dist.new_group([(r * n + s) * t + k for s in holders])
                  for r in range(replicas) for k in range(t)}
        own = mapping.get(f"submod_pp_{index}")
        if own is not None:
            tied.append((own, groups[replica, part]))
    # model states over the stage's replicas: FSDP2 for its sharded units, the rest averaged;
    # bf16 and the optimizer's place as on whole-model replicas (one replica shards nothing)
    levels = exported.strategy.shard if replicas > 1 else [S_NONE] * len(exported.strategy)
    sharding = shard_model(exported, levels=levels, mesh=mesh["dp"])
    # the tied weights as they are now: fully_shard replaces a parameter by its DTensor
    tied = [(exported.module.get_parameter(own), group) for own, group in tied]
    stage = PipelineStage(exported, index, n, torch.device(device), group=mesh["pp"].get_group())
    kind = ScheduleGPipe if strategy.schedule == "gpipe" else Schedule1F1B
    schedule = kind(stage, strategy.microbatches, loss_fn=loss_fn)
    return PipelineRun(exported, stage, schedule, index, replica, sharding, tied)
