"""A strategy's precision and optimizer place in the exported script (with :mod:`.fsdp`).

* ``bf16`` — bf16 parameters and gradients, fp32 master weights and optimizer states. An FSDP2
  group takes ``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)``
  (:func:`mp_policy`): its sharded parameter stays fp32 — it is the master weight, with an
  fp32 gradient shard — and each all-gather casts it to bf16 for compute. A parameter FSDP2
  does not manage (replicated: DistributedDataParallel, or levels ``none`` / ``optimizer``) is
  cast to bf16 (:func:`cast_parameters`) and the optimizer steps an fp32 master copy of it
  (:class:`Steps`): PyTorch has no master-weight optimizer of its own. Gradients are averaged
  in fp32 either way (:func:`fp32_allreduce_hook` under DistributedDataParallel,
  :func:`average_gradients` beside FSDP2).
* ``pure-bf16`` — every parameter cast to bf16, its gradient and Adam moments too (torch's
  Adam keeps states in the parameter's dtype); FSDP2 groups still reduce-scatter in fp32.
* ``fp32`` (or no precision) — the model's own dtype.
* optimizer offload (``Strategy.offload_optimizer``, ZeRO-Offload) — the unit's optimizer states
  and step on the host. An FSDP2 group takes ``CPUOffloadPolicy`` (:func:`offload_policy`):
  FSDP2 keeps the sharded parameters and gradients on the host with them, and the optimizer
  steps there. Another parameter gets a host master copy (fp32 under ``bf16``): its gradient is
  copied to the host, the host copy stepped, the parameter copied back (:class:`Steps`).

Floating inputs enter in bf16 (:func:`cast_inputs`; FSDP2's own cast in its groups); the loss is
computed in fp32 (the script's ``loss_of``); buffers keep their dtype but for a batch norm's
running statistics (:func:`cast_statistics`): PyTorch's batch norm takes a bf16 input with its
weight and statistics all fp32 or all bf16, and the weight computes in bf16. These casts are
:mod:`memflow.graph.compute`'s rule, which capture's bf16 pass follows, so the memory model
charges what this program holds (``OpGraph.bf16``).

>>> from torch import nn
>>> m = nn.Linear(4, 2)
>>> cast_parameters(m.parameters(), "bf16")
>>> opt = Steps.build(list(m.parameters()), torch.optim.Adam, {"lr": 0.1}, precision="bf16")
>>> m(cast_inputs(torch.ones(1, 4), "bf16")).float().sum().backward(); opt.step()
>>> m.weight.dtype, opt.masters[0].dtype, opt.master_bytes()
(torch.bfloat16, torch.float32, {'device': 40, 'host': 0})
"""
from __future__ import annotations

from typing import Any, Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.utils import _pytree as pytree

from ..graph.compute import COMPUTE_DTYPE, cast_buffer_names

__all__ = ["compute_dtype", "mp_policy", "offload_policy", "cast_parameters", "cast_statistics",
           "cast_inputs", "average_gradients", "fp32_allreduce_hook", "Steps"]

HOST = torch.device("cpu")


def compute_dtype(precision: str | None) -> torch.dtype | None:
    """The dtype parameters compute in under ``precision`` (None: the model's own).

    >>> compute_dtype("pure-bf16"), compute_dtype("fp32")
    (torch.bfloat16, None)
    """
    return COMPUTE_DTYPE if precision in ("bf16", "pure-bf16") else None


def mp_policy(precision: str | None):
    """FSDP2's ``MixedPrecisionPolicy`` for ``precision``: bf16 compute, fp32 reductions."""
    from torch.distributed.fsdp import MixedPrecisionPolicy
    if compute_dtype(precision) is None:
        return MixedPrecisionPolicy()
    # pure-bf16 parameters are bf16 already (cast_parameters): no fp32 shard to cast from
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16 if precision == "bf16" else None,
                                reduce_dtype=torch.float32)


def offload_policy(offload: bool):
    """FSDP2's offload policy: ``CPUOffloadPolicy`` for a group whose optimizer is on the host
    (pinned host memory where there is a GPU to copy from)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy
    return CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if offload else OffloadPolicy()


def cast_parameters(params: Iterable[nn.Parameter], precision: str | None) -> None:
    """Cast floating ``params`` in place to ``precision``'s compute dtype (a DTensor swapped
    whole, as ``nn.Module.to`` does: setting its ``.data`` would leave its local shard)."""
    dtype = compute_dtype(precision)
    if dtype is not None:
        for p in params:
            if p.is_floating_point() and hasattr(p, "_local_tensor"):
                torch.utils.swap_tensors(p, nn.Parameter(p.detach().to(dtype), p.requires_grad))
            elif p.is_floating_point():
                p.data = p.data.to(dtype)


def cast_statistics(module: nn.Module, precision: str | None) -> None:
    """Cast the running statistics of ``module``'s batch norms in place to ``precision``'s
    compute dtype (:func:`memflow.graph.compute.cast_buffer_names`, the rule capture's bf16
    pass follows), as ``nn.Module.to(torch.bfloat16)`` casts them: the batch norm kernel
    takes a bf16 input with its weight, bias and statistics all in one dtype (or all fp32),
    and its weight computes in bf16 (cast here, or by FSDP2's all-gather). Statistics are
    running averages, never stepped: no master copy.

    >>> bn = nn.BatchNorm1d(3)
    >>> cast_statistics(bn, "bf16"); cast_parameters(bn.parameters(), "bf16")
    >>> bn.running_var.dtype, bn(torch.ones(2, 3, dtype=torch.bfloat16)).dtype
    (torch.bfloat16, torch.bfloat16)
    """
    dtype = compute_dtype(precision)
    if dtype is None:
        return
    for name in cast_buffer_names(module):
        owner, _, attr = name.rpartition(".")
        m = module.get_submodule(owner)
        setattr(m, attr, getattr(m, attr).to(dtype))


def cast_inputs(tree: Any, precision: str | None) -> Any:
    """``tree`` (inputs of the model) with its floating tensors in ``precision``'s compute
    dtype; integer tensors (token ids, masks) unchanged."""
    dtype = compute_dtype(precision)
    if dtype is None:
        return tree
    return pytree.tree_map_only(
        torch.Tensor, lambda t: t.to(dtype) if t.is_floating_point() else t, tree)


def average_gradients(params: Iterable[nn.Parameter], group=None) -> None:
    """Average the gradients of ``params`` over ``group``, reduced in fp32 (a DTensor's local
    shard is averaged)."""
    world = dist.get_world_size(group)
    for p in params:
        if p.grad is not None:
            grad = getattr(p.grad, "_local_tensor", p.grad)
            wide = grad if grad.dtype == torch.float32 else grad.float()
            dist.all_reduce(wide, group=group)
            grad.copy_(wide.div_(world))


def fp32_allreduce_hook(state, bucket):
    """A DistributedDataParallel communication hook averaging a bf16 bucket in fp32, as
    FSDP2's ``reduce_dtype=float32`` does."""
    buffer = bucket.buffer()
    wide = buffer.float().div_(dist.get_world_size(state))
    fut = dist.all_reduce(wide, group=state, async_op=True).get_future()
    return fut.then(lambda f: buffer.copy_(f.value()[0]))


class Steps:
    """Several optimizers stepped as one. ``links`` pair a parameter with the tensor an
    optimizer steps for it: a DTensor parameter's local shard (same storage), or one of the
    ``masters`` — an fp32 copy, or a host copy when offloaded (``host``: their ids) — whose
    gradient is copied in and whose update is copied back. ``params`` are the model's
    parameters, whose gradients backward makes: a loss scaler unscales them (its
    ``param_groups``, :mod:`memflow.export.amp`) before :meth:`step` copies them on."""

    def __init__(self, parts: list, links: list[tuple], masters: list[nn.Parameter] = (),
                 host: set[int] = frozenset(), params: list[nn.Parameter] = ()):
        self.parts, self.links = parts, [(p, q) for p, q in links if p is not q]
        self.masters, self.host = list(masters), set(host)
        self.param_groups = [{"params": list(params)}]

    @classmethod
    def build(cls, params: list[nn.Parameter], opt_class: type, options: dict, *,
              precision: str | None = None, host: set[int] = frozenset(),
              zero: list | None = None, group=None, fsdp: set[int] | None = None) -> "Steps":
        """The optimizer of ``params``: masters for bf16 parameters under ``bf16`` and for
        those whose ids are in ``host``; ``zero`` (ZeRO-1's parameters) under
        ``ZeroRedundancyOptimizer`` over ``group``. FSDP2's parameters (ids ``fsdp``; by
        default every DTensor) are stepped as they are (its policies already hold them as
        the precision and place say); a tensor-parallel shard FSDP2 leaves is not one."""
        wide = precision == "bf16"
        zero_ids = {id(p) for p in zero or []}
        plain, links, masters, on_host = [], [], [], set()
        for p in params:
            if id(p) in zero_ids:
                continue
            if (id(p) in fsdp if fsdp is not None else hasattr(p, "device_mesh")) or not (
                    id(p) in host or (wide and p.dtype == torch.bfloat16)):
                plain.append(p)
                continue
            copy = nn.Parameter(p.detach().to(HOST if id(p) in host else p.device,
                                              torch.float32 if wide else p.dtype, copy=True))
            links.append((p, copy))
            masters.append(copy)
            if id(p) in host:
                on_host.add(id(copy))
        parts = [opt_class(group_, **options) for group_ in (plain, masters) if group_]
        if zero:
            from torch.distributed.optim import ZeroRedundancyOptimizer
            # it broadcasts plain tensors: a tensor-parallel (DTensor) parameter's local shard
            # stands in for it, sharing its storage
            views = [(p, nn.Parameter(p._local_tensor) if hasattr(p, "_local_tensor") else p)
                     for p in zero]
            parts.insert(0, ZeroRedundancyOptimizer([q for _, q in views],
                                                    optimizer_class=opt_class,
                                                    process_group=group, **options))
            links += views
        return cls(parts, links, masters, on_host, params)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.parts:
            o.zero_grad(set_to_none=set_to_none)
        for p, _ in self.links:
            p.grad = None

    def step(self, closure=None) -> None:
        masters = {id(q) for q in self.masters}
        for p, q in self.links:
            q.grad = None if p.grad is None else (
                p.grad.to(q.device, q.dtype) if id(q) in masters else _local(p.grad))
        for o in self.parts:
            o.step()
        with torch.no_grad():
            for p, q in self.links:
                if id(q) in masters:
                    p.copy_(q)
                    q.grad = None   # the wide copy lives for the step only, as charged

    def master_bytes(self) -> dict[str, int]:
        """Bytes of the master copies on the device and on the host."""
        host = sum(q.nbytes for q in self.masters if id(q) in self.host)
        return {"device": sum(q.nbytes for q in self.masters) - host, "host": host}


def _local(t: torch.Tensor) -> torch.Tensor:
    return getattr(t, "_local_tensor", t)
