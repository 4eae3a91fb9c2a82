"""Which aten ops are *expensive*: the ones selective recomputation keeps the outputs of.

Selective recomputation (Korthikanti et al. 2022; PyTorch's selective activation
checkpointing) keeps, inside a recomputed unit, the outputs of the ops that cost the most to
re-run — matrix products, convolutions, fused attention — and recomputes everything else.
The rule is data: :data:`EXPENSIVE_OPS`, aten op names (overload packets), read by capture
(``from_torch(..., expensive_ops=...)`` overrides it and records the set in ``graph.meta``),
which flags each storage such an op makes and counts their forward cost per unit, and by
export's selective checkpoint policy.

>>> is_expensive(torch.ops.aten.addmm.default)
True
>>> is_expensive(torch.ops.aten.gelu.default), is_expensive(torch.ops.aten.gelu.default, {"gelu"})
(False, True)
"""
from __future__ import annotations

from typing import Collection

import torch

__all__ = ["EXPENSIVE_OPS", "is_expensive", "op_name"]

EXPENSIVE_OPS = frozenset({
    # matrix products (what nn.Linear and @ dispatch to)
    "mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "_int_mm",
    # convolutions
    "convolution", "_convolution", "conv1d", "conv2d", "conv3d", "cudnn_convolution",
    "mkldnn_convolution", "convolution_overrideable", "conv_transpose1d", "conv_transpose2d",
    "conv_transpose3d", "cudnn_convolution_transpose",
    # fused attention
    "scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_flash_attention_forward",
    "_efficient_attention_forward",
})
"""The default expensive ops (aten overload packet names)."""


def op_name(func) -> str:
    """The overload packet name of an aten op: ``"addmm"`` for ``aten.addmm.default``.

    >>> op_name(torch.ops.aten.bmm.default)
    'bmm'
    """
    return func._schema.name.split("::")[-1]


def is_expensive(func, ops: Collection[str] = EXPENSIVE_OPS) -> bool:
    """Whether selective recomputation keeps the outputs of ``func`` (an aten op)."""
    return op_name(func) in ops
