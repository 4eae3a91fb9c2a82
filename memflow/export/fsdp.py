"""Sharded model states: a strategy's shard levels as FSDP2 ``fully_shard`` and ZeRO-1.

The exported script's whole-model replicas (one process each) shard what the strategy's
shard levels (:data:`~memflow.strategy.SHARD_LEVELS`) say, over the data-parallel group:

* ``parameters`` (ZeRO-3, FSDP full shard) — the unit's module is a ``fully_shard`` group
  with ``reshard_after_forward=True``: its parameters are all-gathered before forward and
  again before backward, freed after each, and its gradients reduce-scattered;
* ``gradients`` (ZeRO-2) — ``reshard_after_forward=False``: the gathered parameters stay from
  forward to backward, gradients and optimizer states are sharded;
* ``optimizer`` (ZeRO-1) — parameters and gradients replicated, averaged over the replicas;
  the optimizer states of these parameters are partitioned by
  ``torch.distributed.optim.ZeroRedundancyOptimizer`` (whole tensors per rank);
* ``none`` — replicated, gradients averaged (``DistributedDataParallel`` when no unit is a
  ``fully_shard`` group; else FSDP2 ignores these parameters and :meth:`Sharding.after_backward`
  averages their gradients).

A unit whose parameters cannot be a group of its own — glue, a module called more than once,
tied weights (:func:`~memflow.strategy.runnable.root_sharded`) — is sharded at the root
``fully_shard`` of the model, at the one level those units share. The strategy's memory
policies keep running inside: recompute segments are non-reentrant checkpoints, whose
replayed forward all-gathers again under FSDP2. The strategy's precision and optimizer place
(:mod:`~memflow.export.model_states`) ride on the same groups: FSDP2's ``MixedPrecisionPolicy``
and ``CPUOffloadPolicy`` for a ``fully_shard`` group, bf16 casts, fp32 master copies and host
copies for the parameters it leaves whole.

>>> from memflow.strategy import Strategy
>>> s = Strategy(["a", "b"], devices=[("gpu0", "gpu1")] * 2, sample=[2, 2])
>>> sharded(s), sharded(s.with_shard({"b": "parameters"}))
(False, True)
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..errors import ExportError
from ..graph.units import ROOT
from ..strategy.shard_levels import S_GRADIENTS, S_NONE, S_OPTIMIZER, S_PARAMETERS, SHARD_LEVELS
from .model_states import (Steps, average_gradients, cast_inputs, cast_parameters,
                           cast_statistics, compute_dtype, fp32_allreduce_hook, mp_policy,
                           offload_policy)

__all__ = ["sharded", "shard_model", "Sharding"]


def sharded(strategy) -> bool:
    """Whether ``strategy`` shards model states over more than one replica."""
    return int(strategy.sample[0]) > 1 and bool((strategy.shard != S_NONE).any())


@dataclass
class Sharding:
    """A replica with its model states as the strategy says: ``module`` to train, and what
    the training loop adds — :meth:`inputs`, :meth:`after_backward` and :meth:`optimizer`."""

    module: nn.Module
    replicated: list[nn.Parameter] = field(default_factory=list)
    """Parameters FSDP2 leaves whole (levels none and optimizer), averaged by hand."""
    zero: list[nn.Parameter] = field(default_factory=list)
    """Parameters whose optimizer states ZeroRedundancyOptimizer partitions (ZeRO-1)."""
    average: bool = True
    """Whether :meth:`after_backward` averages ``replicated`` (False under
    DistributedDataParallel, which does it itself, or in one process)."""
    group: Any = None
    """The data-parallel process group (None: all processes)."""
    precision: str | None = None
    """The strategy's precision (:mod:`~memflow.export.model_states`)."""
    host: set[int] = field(default_factory=set)
    """Ids of the parameters FSDP2 does not manage whose optimizer is on the host."""

    def inputs(self, tree: Any) -> Any:
        """The model's inputs in the precision's compute dtype."""
        return cast_inputs(tree, self.precision)

    def after_backward(self) -> None:
        """Average the replicated parameters' gradients over the data-parallel group."""
        if self.average and self.replicated:
            average_gradients(self.replicated, self.group)

    def no_sync(self):
        """A context for the backwards of all micro-batches but the last under gradient
        accumulation (:mod:`memflow.export.accumulation`): gradients accumulate where they
        are, reduced once with the last — DistributedDataParallel's ``no_sync``, FSDP2's
        ``set_requires_gradient_sync(False)``; the replicated parameters are averaged by
        :meth:`after_backward` anyway."""
        from torch.distributed.fsdp import FSDPModule
        from torch.nn.parallel import DistributedDataParallel

        if isinstance(self.module, DistributedDataParallel):
            return self.module.no_sync()
        roots = [m for m in self.module.modules() if isinstance(m, FSDPModule)]
        return _without_gradient_sync(roots[0]) if roots else contextlib.nullcontext()

    def optimizer(self, cls: type, **options: Any) -> Steps:
        """``cls(params, **options)`` for the module's parameters: the ZeRO-1 ones under
        ``ZeroRedundancyOptimizer`` (their states partitioned over the replicas), fp32 master
        copies of bf16 parameters and host copies of offloaded ones stepped in their place
        (:class:`~memflow.export.model_states.Steps`)."""
        left = {id(p) for p in self.replicated}     # a DTensor among them: a TP shard
        return Steps.build(list(self.module.parameters()), cls, options,
                           precision=self.precision, host=self.host, zero=self.zero,
                           group=self.group, fsdp={id(p) for p in self.module.parameters()
                                                   if hasattr(p, "device_mesh")
                                                   and id(p) not in left})


def _groups(exported) -> tuple[list[tuple[Any, nn.Module]], list[Any], list[nn.Parameter]]:
    """The units that are ``fully_shard`` groups of their own (span, module); the units
    sharded at the root; the parameters no unit reads (left at the root too)."""
    model = exported.module
    modules = dict(model.named_modules())
    modules[ROOT] = model
    readers: dict[int, list[Any]] = {}
    calls: dict[str, int] = {}
    for s in exported.spans:
        if s.role == "module":
            calls[s.module] = calls.get(s.module, 0) + 1
        m = modules.get(s.module)
        if m is None:
            continue
        for p in m.parameters(recurse=s.role == "module"):
            readers.setdefault(id(p), []).append(s)
    alone, root = [], []
    for s in exported.spans:
        m = modules.get(s.module)
        params = list(m.parameters(recurse=s.role == "module")) if m is not None else []
        if not params:
            continue
        if (s.role == "module" and s.module != ROOT and calls[s.module] == 1
                and all(len(readers[id(p)]) == 1 for p in params)):
            alone.append((s, m))
        else:
            root.append(s)
    unread = [p for p in model.parameters() if id(p) not in readers]
    return alone, root, unread


def shard_model(exported, device: torch.device | None = None, *, levels=None,
                mesh=None) -> Sharding:
    """Shard the model states of ``exported`` (one replica from
    :func:`memflow.export.apply`) as its strategy's shard levels, precision and optimizer
    place say; returns the :class:`Sharding` to train. In a running process group of its
    replicas it shards (FSDP2, ZeRO-1) or replicates (DistributedDataParallel); without one
    (a single replica) the levels shard nothing.

    On the tensor-parallel path, ``exported`` is one rank's shard of a replica
    (:func:`~memflow.export.tensor_parallel.parallelize`), ``levels`` the strategy's shard
    codes and ``mesh`` the data-parallel ``DeviceMesh`` of its 2-D mesh: FSDP2 then shards the
    DTensor shards over the replicas, as torchtitan composes FSDP2 with tensor parallelism.

    Raises :class:`~memflow.errors.ExportError` naming the units when the units sharded at
    the root ask for different levels.
    """
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    strategy = exported.strategy
    levels = strategy.shard if levels is None else levels
    if mesh is None and not sharded(strategy):
        levels = [S_NONE] * len(levels)     # one replica, or no level: nothing to shard
    alone, root, unread = _groups(exported)
    root_levels = {int(levels[s.index]) for s in root}
    if len(root_levels) > 1:
        raise ExportError(
            f"units {[s.name for s in root]} are sharded at the model's root fully_shard group "
            f"(glue, a module called more than once, or a shared weight), so they need one "
            f"shard level; they have {sorted(SHARD_LEVELS[k] for k in root_levels)}")
    root_level = root_levels.pop() if root_levels else S_NONE
    whole = [p for s, m in alone if levels[s.index] in (S_NONE, S_OPTIMIZER)
             for p in m.parameters()]
    if root_level in (S_NONE, S_OPTIMIZER):
        whole += [p for s in root for p in _unit_params(exported, s)] + unread
    zero = [p for s, m in alone if levels[s.index] == S_OPTIMIZER for p in m.parameters()]
    if root_level == S_OPTIMIZER:
        zero += [p for s in root for p in _unit_params(exported, s)]
    # a parameter listed twice (two root units reading it) is one parameter
    whole, zero = _unique(whole), _unique(zero)
    precision, offload = strategy.precision, strategy.offload_optimizer
    # bf16: FSDP2 casts its own groups' parameters (mp_policy), the rest are cast here
    cast_parameters(whole if precision == "bf16" else exported.parameters(), precision)
    cast_statistics(exported, precision)
    # FSDP2 groups take their offload policy; the rest step host copies (ids of live objects)
    host = {id(p) for s in exported.spans if offload[s.index]
            for p in _unit_params(exported, s)} & {id(p) for p in whole}
    fsdp = root_level in (S_GRADIENTS, S_PARAMETERS) or any(
        levels[s.index] in (S_GRADIENTS, S_PARAMETERS) for s, _ in alone)
    group = mesh.get_group() if mesh is not None else None
    states = dict(precision=precision, host=host)
    if not fsdp and mesh is not None:
        return Sharding(exported, whole, zero, group=group, **states)
    if not fsdp and not dist.is_initialized():
        return Sharding(exported, average=False, **states)
    if not fsdp:
        single = device is not None and device.type == "cuda" and len(
            {d for parts in exported.devices for d in parts}) == 1
        ddp = DistributedDataParallel(exported, device_ids=[device] if single else None)
        if compute_dtype(precision) is not None:        # bf16 gradients averaged in fp32
            ddp.register_comm_hook(None, fp32_allreduce_hook)
        return Sharding(ddp, whole, zero, average=False, **states)
    if mesh is None:
        from torch.distributed.device_mesh import init_device_mesh
        # every replica starts from rank 0's weights, as DistributedDataParallel makes them
        for t in [*exported.module.parameters(), *exported.module.buffers()]:
            dist.broadcast(t.data, 0)
        kind = device.type if device is not None else "cpu"
        mesh = init_device_mesh(kind, (dist.get_world_size(),))
    policy = mp_policy(precision)
    for s, m in alone:
        if levels[s.index] in (S_GRADIENTS, S_PARAMETERS):
            with _on(_devices(m.parameters(), [s])):    # a group stays on its unit's device
                fully_shard(m, mesh=mesh, mp_policy=policy,
                            offload_policy=offload_policy(bool(offload[s.index])),
                            reshard_after_forward=bool(levels[s.index] == S_PARAMETERS))
    ignored = set(whole)
    rest = [p for p in exported.module.parameters() if p not in ignored and not
            hasattr(p, "device_mesh")]
    with _on(_devices(rest, root)):
        fully_shard(exported.module, mesh=mesh, reshard_after_forward=root_level == S_PARAMETERS,
                    ignored_params=ignored, mp_policy=policy,
                    offload_policy=offload_policy(bool(rest) and any(offload[s.index]
                                                                    for s in root)))
    return Sharding(exported, whole, zero, group=mesh.get_group(), **states)


@contextlib.contextmanager
def _without_gradient_sync(root):
    root.set_requires_gradient_sync(False)      # recurses into every fully_shard group
    try:
        yield
    finally:
        root.set_requires_gradient_sync(True)


def _devices(params, spans) -> torch.device | None:
    """The one device of ``params`` (the parameters of units ``spans``), None for none."""
    found = {p.device for p in params}
    if len(found) > 1:
        raise ExportError(f"units {[s.name for s in spans]} are one fully_shard group but "
                          f"their parameters lie on {sorted(map(str, found))}; a group's "
                          "parameters share one device. Valid: the same devices for them")
    return found.pop() if found else None


def _on(device: torch.device | None):
    """The context in which FSDP2 places a group on ``device`` (the current CUDA device)."""
    if device is not None and device.type == "cuda":
        return torch.cuda.device(device)
    return contextlib.nullcontext()


def _unit_params(exported, span) -> list[nn.Parameter]:
    m = exported.module if span.module == ROOT else exported.module.get_submodule(span.module)
    return list(m.parameters(recurse=span.role == "module"))


def _unique(params: list[nn.Parameter]) -> list[nn.Parameter]:
    return list({id(p): p for p in params}.values())
