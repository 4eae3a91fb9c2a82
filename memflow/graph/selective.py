"""Which aten ops are *expensive*: the ones selective recomputation keeps the outputs of.

Selective recomputation (Korthikanti et al. 2022; PyTorch's selective activation
checkpointing) keeps, inside a recomputed unit, the outputs of the ops that cost the most to
re-run — matrix products, convolutions, fused attention — and recomputes everything else.
The rule is data: :data:`EXPENSIVE_OPS`, aten op names (overload packets), read by capture
(``from_torch(..., expensive_ops=...)`` overrides it and records the set in ``graph.meta``),
which flags each storage such an op makes and counts their forward cost per unit, and by
export's selective checkpoint policy.

Selective checkpointing hands recomputation the *saved* output of an expensive op. If a later
op of the forward wrote that output in place, recomputation reads the written value, not the
one the forward read: :func:`unreplayable_write` is the rule (capture marks the units it
breaks, ``selective_replays``; export refuses them), written once here for both.

>>> is_expensive(torch.ops.aten.addmm.default)
True
>>> is_expensive(torch.ops.aten.gelu.default), is_expensive(torch.ops.aten.gelu.default, {"gelu"})
(False, True)
"""
from __future__ import annotations

from typing import Callable, Collection, Container, Hashable

import torch

__all__ = ["EXPENSIVE_OPS", "IDEMPOTENT_INPLACE", "is_expensive", "op_name",
           "unreplayable_write"]

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


# In-place ops that give the same result applied to their own result (relu_(relu_(x)) =
# relu_(x)): one may write a kept output, as recompute then re-applies it to the written value.
IDEMPOTENT_INPLACE = frozenset({"relu_", "hardtanh_", "clamp_", "clip_", "threshold_",
                                "relu6_"})


def unreplayable_write(func, args: tuple, kept: Container, read: set,
                       key: Callable[[torch.Tensor], Hashable]):
    """The key of a kept output (an expensive op's, ``key(t) in kept``) that forward op
    ``func`` writes in place so that recomputation would see another value — a write that is
    not idempotent, or one after an op read the output — else None. Kept outputs the op reads
    without aliasing them are added to ``read``.

    >>> x = torch.ones(2)
    >>> read = set()
    >>> unreplayable_write(torch.ops.aten.relu_.default, (x,), {id(x)}, read, id) is None
    True
    >>> unreplayable_write(torch.ops.aten.exp.default, (x,), {id(x)}, read, id), len(read)
    (None, 1)
    >>> unreplayable_write(torch.ops.aten.relu_.default, (x,), {id(x)}, read, id) == id(x)
    True
    """
    reads = not any(r.alias_info is not None for r in func._schema.returns)
    for arg, value in zip(func._schema.arguments, args):
        if not isinstance(value, torch.Tensor):
            continue
        k = key(value)
        if k not in kept:
            continue
        if arg.alias_info is not None and arg.alias_info.is_write:
            if op_name(func) not in IDEMPOTENT_INPLACE or k in read:
                return k
        elif reads:
            read.add(k)
    return None
