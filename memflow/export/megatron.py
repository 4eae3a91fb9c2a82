"""Megatron's tensor parallelism of a block in one process: a split container's declared
modules (an attention, an MLP: their ``tp_plan``, :func:`memflow.graph.slicing.tensor_degree`)
run as ``p`` copies, each holding one rank's slices on one device of the unit's parts.

Copy ``r`` keeps rank ``r``'s rows of each column-parallel child (``colwise-sharded``; a fused
``qkv`` regrouped by heads first, ``colwise-qkv``) and the matching input columns of each
row-parallel child (``rowwise``; its bias on copy 0 only), so it computes rank ``r``'s heads or
hidden units; the copies' outputs are summed on the first device, which is what the row-parallel
all-reduce gives across processes (:mod:`memflow.export.tensor_parallel`). The block's
normalizations stay whole on the first device, replicated as Megatron keeps them. A declared
module whose heads or sharded widths the degree does not divide stays whole on the first
device (the processes' path runs its linears gathered then).

>>> import torch
>>> from memflow.zoo.llama import MLP
>>> mlp = MLP(4, 6)
>>> x = torch.randn(2, 4)
>>> parts = Summed([_part(mlp, r, 2) for r in range(2)], [torch.device("cpu")] * 2)
>>> torch.allclose(parts(x), mlp(x), atol=1e-6), tuple(parts.parts[1].down_proj.weight.shape)
(True, (4, 3))
"""
from __future__ import annotations

import copy
from typing import Sequence

import torch
from torch import nn
from torch.utils import _pytree as pytree

from ..graph.slicing import declared_degree
from .tp_styles import _regroup

__all__ = ["Summed", "split_block"]


class Summed(nn.Module):
    """Copies of one module, each on its device, run on the same inputs; outputs summed on the
    first device."""

    def __init__(self, parts: Sequence[nn.Module], devices: Sequence[torch.device]):
        super().__init__()
        self.parts = nn.ModuleList(parts)
        self.devices = list(devices)

    def forward(self, *args, **kwargs):
        home, total = self.devices[0], None
        for m, d in zip(self.parts, self.devices):
            a, k = pytree.tree_map_only(torch.Tensor, lambda t, d=d: t.to(d, non_blocking=True),
                                        (args, kwargs))
            out = m(*a, **k).to(home, non_blocking=True)
            total = out if total is None else total + out
        return total


def _part(module: nn.Module, rank: int, ranks: int) -> nn.Module:
    """A copy of declared module ``module`` holding rank ``rank``'s slices (module docstring)."""
    plan = module.tp_plan
    part = copy.deepcopy(module, {id(t): None for c in plan
                                  for t in getattr(module, c).parameters(recurse=False)})
    for child, style in plan.items():
        whole, new = getattr(module, child), getattr(part, child)
        for name in ("weight", "bias"):
            t = getattr(whole, name)
            if t is None:
                continue
            if style == "rowwise":      # input columns; the bias once, on copy 0
                n = whole.in_features // ranks
                kept = t[..., rank * n:(rank + 1) * n] if name == "weight" else (
                    t if rank == 0 else None)
            else:                       # output rows, regrouped by heads for a fused qkv
                n = whole.out_features // ranks
                rows = _regroup(t.detach(), ranks) if style == "colwise-qkv" else t
                kept = rows[rank * n:(rank + 1) * n]
            setattr(new, name, None if kept is None else
                    nn.Parameter(kept.detach().clone(), requires_grad=t.requires_grad))
        if style == "rowwise":
            new.in_features = whole.in_features // ranks
        else:
            new.out_features = whole.out_features // ranks
    return part


def split_block(block: nn.Module, devices: Sequence[torch.device]) -> nn.Module:
    """``block`` (changed in place and returned) with each declared module inside it that
    ``len(devices)`` divides replaced by a :class:`Summed` of its ranks' copies on
    ``devices``."""
    ranks = len(devices)
    found = [(path, m) for path, m in block.named_modules()
             if declared_degree(m) and declared_degree(m) % ranks == 0]
    for path, m in found:
        parts = Summed([_part(m, r, ranks).to(d) for r, d in enumerate(devices)], devices)
        parent, _, attr = path.rpartition(".")
        setattr(block.get_submodule(parent) if parent else block, attr, parts)
    return block
