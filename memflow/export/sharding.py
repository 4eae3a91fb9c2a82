"""Parameter splits: a unit's output features sharded over the devices of its parts.

FlexFlow's parameter dimension of a ``Linear`` or a convolution is its output channels; of an
``Embedding``, its embedding dimension. :class:`Sharded` replaces such a module by ``p``
slices of it, one per device: each computes its share of the output from a copy of the input,
and the shares are concatenated on the first part's device. Its parameters are the slices
(``shards.K.weight``), each on its own device, so each device holds ``1/p`` of the weights, as
the memory model assumes. Modules of other kinds, grouped convolutions and parameters shared
with another module (tied weights) cannot be sliced this way: :func:`shard` raises
:class:`~memflow.errors.ExportError` naming the unit.

>>> lin = nn.Linear(8, 6)
>>> sharded = shard("fc", lin, [torch.device("cpu")] * 3, shared=set())
>>> x = torch.randn(2, 8)
>>> torch.allclose(sharded(x), lin(x)), [tuple(s.weight.shape) for s in sharded.shards]
(True, [(2, 8), (2, 8), (2, 8)])
"""
from __future__ import annotations

import copy
from typing import Sequence

import torch
from torch import nn

from ..errors import ExportError
from ..graph.slicing import CONVOLUTIONS, SLICEABLE, shard_axis, tensor_degree
from .megatron import split_block

__all__ = ["Sharded", "shard"]


class Sharded(nn.Module):
    """Slices of one module on several devices; outputs concatenated along ``dim``."""

    def __init__(self, shards: Sequence[nn.Module], devices: Sequence[torch.device], dim: int):
        super().__init__()
        self.shards = nn.ModuleList(shards)
        self.devices = list(devices)
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = [m(x.to(d, non_blocking=True)) for m, d in zip(self.shards, self.devices)]
        home = self.devices[0]
        return torch.cat([o.to(home, non_blocking=True) for o in outs], dim=self.dim)


def _slice(module: nn.Module, start: int, stop: int) -> nn.Module:
    """A copy of ``module`` keeping outputs ``start:stop`` (rows of the weight, or columns of
    an embedding table)."""
    # A deep copy that skips the full weight and bias (memo entries stand in for them).
    part = copy.deepcopy(module, {id(t): None for t in (module.weight, getattr(module, "bias", None))
                                  if t is not None})
    axis = shard_axis(module)
    part.weight = nn.Parameter(module.weight.detach().narrow(axis, start, stop - start).clone(),
                               requires_grad=module.weight.requires_grad)
    if isinstance(module, nn.Embedding):
        part.embedding_dim = stop - start
    elif isinstance(module, nn.Linear):
        part.out_features = stop - start
    else:
        part.out_channels = stop - start
    if getattr(module, "bias", None) is not None:
        part.bias = nn.Parameter(module.bias.detach()[start:stop].clone(),
                                 requires_grad=module.bias.requires_grad)
    return part


def shard(unit: str, module: nn.Module, devices: Sequence[torch.device],
          shared: set[int]) -> nn.Module:
    """``module`` (unit ``unit``) split over ``devices``; ``shared`` holds the ids of
    parameters that another module also uses. A block Megatron splits
    (:func:`~memflow.graph.slicing.tensor_degree`) runs its ranks' slices in this process
    (:func:`memflow.export.megatron.split_block`)."""
    p = len(devices)
    axis = shard_axis(module)
    if axis < 0 and tensor_degree(module) and not any(id(t) in shared
                                                      for t in module.parameters()):
        return split_block(module, devices)
    if axis < 0:
        grouped = isinstance(module, CONVOLUTIONS)
        raise ExportError(
            f"unit {unit!r} ({type(module).__name__}"
            + (f", groups={module.groups}" if grouped else "") + f") has a parameter split of "
            f"{p}; export can shard only {', '.join(k.__name__ for k in SLICEABLE)} units (a "
            "convolution with one group) and blocks whose linears declare a Megatron tp_plan. "
            "Valid: parameter=1 here, or a finer unit granularity whose Linear/Conv units are "
            "split")
    if any(id(t) in shared for t in module.parameters()):
        raise ExportError(f"unit {unit!r} shares its weight with another module (tied "
                          "weights); slicing it would untie them. Use parameter=1 here")
    total = module.weight.shape[axis]
    if total < p:
        raise ExportError(f"unit {unit!r} has {total} outputs, fewer than its {p} parts")
    bounds = [round(k * total / p) for k in range(p + 1)]
    shards = [_slice(module, a, b).to(d) for a, b, d in zip(bounds, bounds[1:], devices)]
    dim = 1 if isinstance(module, CONVOLUTIONS) else -1
    return Sharded(shards, devices, dim)
