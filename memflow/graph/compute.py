"""What a bf16 step casts: the one rule capture's bf16 pass and the exported script share.

A strategy whose precision computes in bfloat16 (``bf16``: bf16 parameters and gradients with
fp32 masters; ``pure-bf16``) runs the model with

* every floating **parameter** in bfloat16;
* the floating **inputs** in bfloat16 (integer ones — token ids, masks — as they are);
* the running statistics of its **batch norms** in bfloat16 (:func:`cast_buffer_names`):
  PyTorch's batch norm takes a bf16 input with its weight, bias and statistics all in one
  dtype (or all fp32); every other buffer keeps its dtype (a rotary ``inv_freq`` stays fp32);
* the **loss** on the outputs upcast to float32 (:func:`upcast`).

Everything else is the model's own code: where it upcasts (Llama's RMSNorm computes in fp32, a
softmax asked for ``dtype=torch.float32``), the tensors it makes and saves are fp32, and the
others bf16. Capture records that program as it runs (``OpGraph.bf16``,
:func:`memflow.from_torch`); the memory model charges it under a bf16 precision
(:func:`memflow.sim.precision.activation_arrays`); the export casts by the same rule
(:mod:`memflow.export.model_states`).

>>> from torch import nn
>>> sorted(cast_buffer_names(nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))))
['1.running_mean', '1.running_var']
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

__all__ = ["COMPUTE_DTYPE", "cast_buffer_names", "upcast"]

COMPUTE_DTYPE = torch.bfloat16
"""The dtype a bf16 precision computes in."""

_STATISTICS = ("running_mean", "running_var")


def cast_buffer_names(model: nn.Module) -> set[str]:
    """The names of ``model``'s buffers a bf16 step casts: its batch norms' floating running
    statistics (every name, for a buffer shared between modules)."""
    names = set()
    for path, m in model.named_modules(remove_duplicate=False):
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            for attr in _STATISTICS:
                stat = getattr(m, attr, None)
                if isinstance(stat, torch.Tensor) and stat.is_floating_point():
                    names.add(f"{path}.{attr}" if path else attr)
    return names


def upcast(tree: Any) -> Any:
    """``tree`` (a model's output) with its floating tensors in float32, which the loss reads.

    >>> upcast({"logits": torch.ones(1, dtype=torch.bfloat16), "ids": torch.ones(1).long()})
    {'logits': tensor([1.]), 'ids': tensor([1])}
    """
    return pytree.tree_map_only(
        torch.Tensor, lambda t: t.float() if t.is_floating_point() else t, tree)
