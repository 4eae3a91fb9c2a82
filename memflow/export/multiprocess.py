"""The training script's path for strategies that span processes: pipeline stages
(:mod:`~memflow.export.pipelining`), tensor-parallel groups
(:mod:`~memflow.export.tensor_parallel`) and per-unit sample degrees
(:mod:`~memflow.export.sample_groups`).

The exported script (:mod:`memflow.export.train_template`) hands such a strategy to
:func:`train_across_processes`; whole-model replicas (DistributedDataParallel) stay on its own
path. ``torchrun --nproc_per_node`` :func:`processes` starts:

* a pipelined strategy (units in stages): ``replicas × stages`` processes (× ``t`` with
  stages split over tensor-parallel groups of ``t``, :mod:`~memflow.export.stage_tensor`);
  rank ``r * stages + s`` runs stage ``s`` of replica ``r``, fed the ``r``-th share of the batch
  (:func:`~memflow.export.pipelining.stage_ranks` maps the strategy's devices to them); a
  training step is ``schedule.step``, and each stage holds its model states over its
  replicas as the strategy says (FSDP2, ZeRO-1, bf16, the optimizer on the host:
  :func:`~memflow.export.pipelining.build_pipeline`);
* a strategy with parameter splits: ``replicas × p`` processes, rank ``r * p + t`` the ``t``-th
  device of replica ``r``'s tensor-parallel group
  (:func:`~memflow.export.tensor_parallel.tensor_ranks`); every rank of a replica runs that
  replica's whole share of the batch, the split units' shards exchanging through DTensor
  collectives, and gradients are averaged over the replicas;
* a strategy whose units have different sample degrees: a process per device of the strategy
  (:func:`~memflow.export.sample_groups.group_ranks`), each group of units on its devices'
  ranks with their shares of the global batch, activations re-sharded between groups.

Every rank builds the model from the same seed: a tensor-parallel rank keeps its slice of the
same weights, a pipeline stage its stage of the same model. The synthetic batch and target of
replica ``r`` are those of rank ``r`` on the DistributedDataParallel path, so the same model
trains along the same losses whichever way the strategy splits it.

>>> from memflow.strategy import Strategy
>>> pp = Strategy(["a", "b"], devices=[("gpu0", "gpu2"), ("gpu1", "gpu3")], sample=[2, 2],
...               stage=[0, 1], microbatches=2)
>>> tp = Strategy(["a", "b"], devices=[("gpu0", "gpu1"), ("gpu0",)], parameter=[2, 1])
>>> mixed = Strategy(["a", "b"], devices=[("gpu0", "gpu1", "gpu2"), ("gpu0",)], sample=[3, 1])
>>> [(across_processes(s), processes(s, across_processes(s))) for s in (pp, tp, mixed)]
[('pipeline', 4), ('tensor', 2), ('sample', 3)]
"""
from __future__ import annotations

import contextlib
import itertools
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.utils import _pytree as pytree

from ..errors import ExportError
from ..strategy import Strategy
from ..strategy.runnable import sample_problem, shard_problem, unrunnable
from ..strategy.shard_levels import S_NONE
from .accumulation import accumulate, accumulates, micro_batches
from .fsdp import shard_model, sharded
from .model_states import compute_dtype
from .pipelining import average_gradients, build_pipeline, split_points, stage_ranks, stages
from .rank_measure import measure_rank
from .sample_groups import GroupRun, group_ranks
from .stage_tensor import stage_plan, stage_tensor_degree
from .tensor_parallel import parallelize, tensor_groups, tensor_plan

__all__ = ["across_processes", "process_path", "processes", "train_across_processes"]


def across_processes(strategy) -> str | None:
    """By the strategy's shape alone: ``"pipeline"`` (units in stages), ``"tensor"``
    (parameter splits), ``"sample"`` (per-unit sample degrees), or None (whole-model
    replicas, or one process)."""
    if (strategy.sample != strategy.sample[0]).any():
        return "sample"
    if stages(strategy) > 1:
        return "pipeline"
    if (strategy.parameter > 1).any():
        return "tensor"
    return None


def process_path(strategy, model: nn.Module, graph=None) -> str | None:
    """How the training script runs ``strategy``: across processes (:func:`across_processes`)
    where that path takes it, else None — whole-model replicas, each running its units in one
    process (:func:`memflow.export.apply`: in-process stages and parameter shards, GPipe).
    Raises :class:`~memflow.errors.ExportError` with the multi-process path's reason when
    neither path runs the strategy.

    >>> import memflow
    >>> g = memflow.zoo.graph("chain", batch_size=8, units="blocks", n=2, width=8)
    >>> model, _ = memflow.zoo.get("chain", batch_size=8, n=2, width=8)
    >>> s = Strategy.pipeline(g, 2, stages=2, microbatches=2, schedule="1f1b")
    >>> process_path(s, model, g), process_path(Strategy.data_parallel(g, 2), model, g)
    ('pipeline', None)
    """
    kind = across_processes(strategy)
    try:
        problem = shard_problem(strategy, graph)     # the pipeline path runs no FSDP2 yet
        if problem is not None:
            raise ExportError(problem)
        if kind == "pipeline":
            stage_ranks(strategy)      # checks the replicas and stages too
            split_points(strategy, graph)
            if stage_tensor_degree(strategy) > 1:
                stage_plan(model, strategy, graph)
        elif kind == "tensor":
            tensor_plan(model, strategy, graph)
        elif kind == "sample":
            problem = sample_problem(strategy, graph)
            if problem is not None:
                raise ExportError(problem)
        return kind
    except ExportError:
        if unrunnable(strategy, graph) is None:
            return None
        raise


def processes(strategy, kind: str | None) -> int:
    """The number of processes ``torchrun`` starts for ``strategy`` on path ``kind``
    (:func:`process_path`).

    >>> s = Strategy(["a", "b"], devices=[("gpu0", "gpu1"), ("gpu0",)], parameter=[2, 1])
    >>> processes(s, "tensor"), processes(s, None)
    (2, 1)
    """
    if kind == "pipeline":
        return int(strategy.sample[0]) * stages(strategy) * stage_tensor_degree(strategy)
    if kind == "tensor":
        return int(strategy.sample[0]) * len(tensor_groups(strategy)[0])
    if kind == "sample":
        return len(group_ranks(strategy))
    return int(strategy.sample.max())


def _output_shape(model, args: tuple, kwargs: dict) -> torch.Size:
    """The shape of the model's (first floating) output, from a forward on fake tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode(allow_non_fake_inputs=True), torch.no_grad():
        out = model(*args, **kwargs)
    return next(t.shape for t in pytree.tree_leaves(out)
                if isinstance(t, torch.Tensor) and t.is_floating_point())


def train_across_processes(strategy, kind: str, args,
                           build: Callable[[int, int], tuple[Any, Any]], loss_of: Callable,
                           as_args: Callable) -> list[float]:
    """Train ``strategy`` across the processes of the running process group; returns the loss
    of every step (averaged over the replicas).

    The script passes its parsed ``args`` (``steps``, ``batch_size``, ``optimizer``, ``lr``,
    ``loss``, ``seed``, ``data``), ``build(batch, seed)`` -> ``(model, example)`` on CPU (every
    rank's weights from ``args.seed``, replica ``r``'s synthetic batch from ``args.seed + r``,
    as on the DistributedDataParallel path), its ``loss_of(kind, output, target, seed)`` ->
    ``(loss, target)`` and ``as_args(inputs)`` -> ``(args, kwargs)``.
    """
    from tqdm import tqdm
    from .factory import load_callable
    from .validation import capture_units

    rank, world = dist.get_rank(), dist.get_world_size()
    # sample groups: every rank holds the global batch, each group keeps its shares of it
    replicas = 1 if kind == "sample" else int(strategy.sample[0])
    replica = rank // (world // replicas)       # the ranks of a replica are adjacent
    share = args.batch_size // replicas
    model, example = build(share, args.seed)
    if replica:     # this replica's own batch, as DistributedDataParallel's rank gets it
        example = build(share, args.seed + replica)[1]
    seed = args.seed + 1000 + replica
    call = as_args(example)
    sharding = None
    if kind == "pipeline":
        _, target = loss_of(args.loss, torch.zeros(_output_shape(model, *call)), None, seed)
        run = build_pipeline(model, strategy, call, rank=rank,
                             loss_fn=lambda out, tgt: loss_of(args.loss, out, tgt, seed)[0])
        module = run.module
        del model       # the other stages' weights
    elif kind == "sample":
        _, target = loss_of(args.loss, torch.zeros(_output_shape(model, *call)), None, seed)
        run = GroupRun(model, strategy, call, rank=rank)
        module = run.module
        del model       # the other groups' weights
    else:
        from torch.distributed.device_mesh import init_device_mesh
        graph = capture_units(model, example, strategy)   # where outputs flow: Megatron pairs
        mesh = init_device_mesh("cpu", (replicas, world // replicas),
                                mesh_dim_names=("dp", "tp"))
        module = parallelize(model, strategy, mesh["tp"], graph)
        dp_group = mesh["dp"].get_group() if replicas > 1 else None
        if (dp_group is not None and sharded(strategy)) or compute_dtype(
                strategy.precision) is not None or strategy.offload_optimizer.any():
            # FSDP2 over the replicas, precision and optimizer place (one replica: no FSDP2)
            sharding = shard_model(module, levels=strategy.shard if dp_group is not None
                                   else [S_NONE] * len(strategy), mesh=mesh["dp"])
        target = None
        if accumulates(strategy):   # drawn for the whole batch, sliced per micro-batch
            _, target = loss_of(args.loss, torch.zeros(_output_shape(model, *call)), None, seed)
    batches = (itertools.cycle(load_callable(args.data)(replica, replicas, share)) if args.data
               else itertools.repeat((example, None)))
    opt_class, options = ((torch.optim.Adam, {"lr": args.lr}) if args.optimizer == "adam" else
                      (torch.optim.SGD, {"lr": args.lr, "momentum": 0.9 if args.optimizer ==
                                         "momentum" else 0.0}))
    optimizer = (run.optimizer(opt_class, **options) if kind == "pipeline" else
                 sharding.optimizer(opt_class, **options) if sharding else
                 opt_class(list(module.parameters()), **options))
    losses = []
    for step in tqdm(range(args.steps), disable=rank != 0, desc=f"training ({kind})"):
        inputs, given = next(batches)
        if sharding is not None and kind == "tensor":     # bf16 under a bf16 precision
            inputs = sharding.inputs(inputs)
        target = given if given is not None else target
        optimizer.zero_grad(set_to_none=True)
        if kind == "pipeline":
            loss = run.step(*as_args(inputs), target)
        elif kind == "sample":
            loss = run.step(*as_args(inputs), target,
                            lambda out, tgt: loss_of(args.loss, out, tgt, seed)[0])
        else:
            if accumulates(strategy):   # 1F1B with one stage (memflow.export.accumulation)
                m = strategy.microbatches
                loss = accumulate(module, as_args(inputs), m, lambda out, k: loss_of(
                    args.loss, out, target.tensor_split(m)[k], seed)[0],
                    sharding.no_sync if sharding is not None else contextlib.nullcontext)
            else:
                loss, target = loss_of(args.loss, module(*as_args(inputs)[0],
                                                         **as_args(inputs)[1]), target, seed)
                loss.backward()
            if sharding is not None:
                sharding.after_backward()
            elif dp_group is not None:
                average_gradients(module, dp_group)
        optimizer.step()
        if getattr(args, "measure", None) and step == args.steps - 1:
            measure_rank(args.measure, rank, kind,
                         run.forward_module() if kind == "sample" else module, optimizer,
                         micro_batches(*as_args(inputs), strategy.microbatches)[0]
                         if accumulates(strategy) else
                         run.sharding.inputs(as_args(inputs)) if kind == "pipeline" else
                         as_args(inputs),
                         stage=run.stage if kind == "pipeline" else None,
                         microbatches=strategy.microbatches, schedule=strategy.schedule)
        # the loss lives on each replica's last stage (pipeline) or on every rank (tensor)
        value = (loss.detach().float() if loss is not None else torch.zeros(()))
        dist.all_reduce(value)
        losses.append(float(value) / (replicas * stage_tensor_degree(strategy)
                                      if kind == "pipeline" else world))
        if rank == 0:
            tqdm.write(f"step {step + 1}/{args.steps} loss {losses[-1]:.6f}")
    dist.barrier()
    return losses
