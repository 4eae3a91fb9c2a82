"""The selective checkpoint policy of a ``selective`` unit.

A ``selective`` unit runs as a non-reentrant checkpoint of its own whose ``context_fn`` is
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

from functools import partial
from typing import Callable, Collection

from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from ..graph.selective import EXPENSIVE_OPS, is_expensive

__all__ = ["selective_policy", "selective_context", "graph_expensive_ops"]


def selective_policy(ops: Collection[str] = EXPENSIVE_OPS) -> Callable:
    """The SAC ``policy_fn``: ``MUST_SAVE`` for the ops named in ``ops``, else
    ``PREFER_RECOMPUTE``.

    >>> import torch
    >>> selective_policy()(None, torch.ops.aten.mm.default).name
    'MUST_SAVE'
    """
    def policy_fn(ctx, func, *args, **kwargs) -> CheckpointPolicy:
        return (CheckpointPolicy.MUST_SAVE if is_expensive(func, ops)
                else CheckpointPolicy.PREFER_RECOMPUTE)
    return policy_fn


def selective_context(ops: Collection[str] = EXPENSIVE_OPS) -> Callable:
    """``context_fn`` for ``torch.utils.checkpoint`` (``use_reentrant=False``) keeping the
    outputs of ``ops``."""
    return partial(create_selective_checkpoint_contexts, selective_policy(frozenset(ops)))


def graph_expensive_ops(graph) -> frozenset[str]:
    """The expensive ops ``graph`` was captured with (the default set without a graph).

    >>> sorted(graph_expensive_ops(None))[:3]
    ['_convolution', '_efficient_attention_forward', '_flash_attention_forward']
    """
    meta = getattr(graph, "meta", None) or {}
    return frozenset(meta.get("expensive_ops", EXPENSIVE_OPS))
