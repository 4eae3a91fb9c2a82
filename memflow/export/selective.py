"""The selective checkpoint policy of ``selective`` units.

A run of ``selective`` units runs as one non-reentrant checkpoint whose ``context_fn`` is
PyTorch's selective activation checkpointing: ``create_selective_checkpoint_contexts`` with a
policy that *must save* the outputs of the expensive ops (:data:`memflow.graph.selective.
EXPENSIVE_OPS`, or the set the graph was captured with) and *prefers to recompute* every other
op — in backward only the cheap ops re-run, the expensive ones return their saved outputs.

>>> import torch
>>> from torch.utils.checkpoint import checkpoint
>>> lin = torch.nn.Linear(4, 4)
>>> x = torch.randn(2, 4, requires_grad=True)
>>> y = checkpoint(lambda t: torch.tanh(lin(t)), x, use_reentrant=False,
...                context_fn=selective_context())
>>> y.sum().backward()                      # tanh re-runs; addmm returns its saved output
>>> x.grad.shape
torch.Size([2, 4])
"""
from __future__ import annotations

from typing import Callable, Collection

import torch
from torch.utils import _pytree as pytree
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from ..errors import ExportError
from ..graph.selective import EXPENSIVE_OPS, is_expensive, op_name, unreplayable_write

__all__ = ["selective_policy", "selective_context", "graph_expensive_ops"]

def _key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def selective_policy(ops: Collection[str] = EXPENSIVE_OPS) -> Callable:
    """The SAC ``policy_fn`` of one checkpoint call: ``MUST_SAVE`` for the ops named in
    ``ops``, else ``PREFER_RECOMPUTE``.

    A saved output that a later op of the segment writes in place is returned written when
    recompute asks for it: fine for an idempotent write (``relu_``) that nothing read before,
    an :class:`~memflow.errors.ExportError` otherwise (recompute would read another value).

    >>> import torch
    >>> selective_policy()(None, torch.ops.aten.mm.default).name
    'MUST_SAVE'
    """
    saved: set[int] = set()
    read: set[int] = set()

    def policy_fn(ctx, func, *args, **kwargs) -> CheckpointPolicy:
        out = getattr(ctx, "op_output", None)
        forward = ctx is not None and not ctx.is_recompute
        if is_expensive(func, ops):
            if forward:
                saved.update(_key(t) for t in pytree.tree_leaves(out)
                             if isinstance(t, torch.Tensor))
            return CheckpointPolicy.MUST_SAVE
        if forward and saved and unreplayable_write(func, args, saved, read, _key) is not None:
            raise ExportError(
                f"selective: {op_name(func)} writes in place the output of an expensive op "
                "that selective checkpointing saves (after it was read, or not as relu_ "
                "does); recomputation would see the written value. Make that op out of "
                "place (inplace=False), or keep or recompute the unit")
        return CheckpointPolicy.PREFER_RECOMPUTE
    return policy_fn


def selective_context(ops: Collection[str] = EXPENSIVE_OPS) -> Callable:
    """``context_fn`` for ``torch.utils.checkpoint`` (``use_reentrant=False``) keeping the
    outputs of ``ops``: ``create_selective_checkpoint_contexts`` with a fresh
    :func:`selective_policy` per checkpoint call."""
    ops = frozenset(ops)
    return lambda: create_selective_checkpoint_contexts(selective_policy(ops),
                                                        allow_cache_entry_mutation=True)


def graph_expensive_ops(graph) -> frozenset[str]:
    """The expensive ops ``graph`` was captured with (the default set without a graph).

    >>> sorted(graph_expensive_ops(None))[:3]
    ['_convolution', '_efficient_attention_forward', '_flash_attention_forward']
    """
    meta = getattr(graph, "meta", None) or {}
    return frozenset(meta.get("expensive_ops", EXPENSIVE_OPS))
