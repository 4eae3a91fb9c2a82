"""Gradient accumulation: the 1F1B schedule with one pipeline stage.

With one stage, 1F1B runs each micro-batch's forward and then its backward
(:func:`memflow.sim.pipeline.stage_sequence`), so only one micro-batch's activations are held
at a time — gradient accumulation. A module cannot run a backward inside its own forward, so
the training loop does it: :func:`accumulate` slices the batch into ``m`` micro-batches and
runs forward, loss and backward on each, every loss scaled by its share of the batch, so that
the gradients are those of the full batch's mean loss. Gradient synchronisation between
replicas (DistributedDataParallel's ``no_sync``, FSDP2's ``set_requires_gradient_sync``) is
deferred to the last micro-batch (:meth:`memflow.export.fsdp.Sharding.no_sync`).

>>> import torch
>>> from torch import nn
>>> model, x, y = nn.Linear(4, 1), torch.randn(8, 4), torch.randn(8, 1)
>>> mse = nn.functional.mse_loss
>>> loss = accumulate(model, ((x,), {}), 4, lambda out, k: mse(out, y.tensor_split(4)[k]))
>>> accumulated = model.weight.grad.clone(); model.zero_grad()
>>> full = mse(model(x), y); full.backward()
>>> torch.allclose(loss, full), torch.allclose(accumulated, model.weight.grad)
(True, True)
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch
from torch.utils import _pytree as pytree

from ..errors import ExportError

__all__ = ["accumulates", "micro_batches", "accumulate"]


def accumulates(strategy) -> bool:
    """Whether ``strategy`` is gradient accumulation: several micro-batches under 1F1B with
    one pipeline stage (the training loop runs them, :func:`accumulate`).

    >>> from memflow.strategy import Strategy
    >>> s = Strategy(["a"], devices=[("gpu0",)])
    >>> [accumulates(s.with_schedule(microbatches=2, schedule=k)) for k in ("1f1b", "gpipe")]
    [True, False]
    """
    one_stage = int(strategy.stage.max()) <= 0      # stages are 0..n-1, or -1 for none
    return strategy.microbatches > 1 and strategy.schedule == "1f1b" and one_stage


def micro_batches(args: tuple, kwargs: dict, m: int) -> list[tuple[tuple, dict]]:
    """``m`` micro-batches of a call: every tensor whose first dimension is the batch, sliced.

    >>> [a[0].shape[0] for a, _ in micro_batches((__import__("torch").ones(5, 2),), {}, 2)]
    [3, 2]
    """
    if m == 1:
        return [(args, kwargs)]
    leaves, spec = pytree.tree_flatten((args, kwargs))
    batch = next((t.shape[0] for t in leaves if isinstance(t, torch.Tensor) and t.dim()), None)
    if batch is None or batch < m:
        raise ExportError(f"{m} micro-batches need a batch of at least {m} samples; the inputs' "
                          f"first dimension is {batch}")
    cut = [torch.tensor_split(t, m) if isinstance(t, torch.Tensor) and t.dim()
           and t.shape[0] == batch else None for t in leaves]
    return [pytree.tree_unflatten([c[k] if c is not None else x for c, x in zip(cut, leaves)],
                                  spec) for k in range(m)]


def accumulate(model, call: tuple[tuple, dict], m: int, loss: Callable[[Any, int], torch.Tensor],
               no_sync: Callable[[], Any] = contextlib.nullcontext, *,
               autocast: Callable[[], Any] = contextlib.nullcontext,
               scale: Callable[[torch.Tensor], torch.Tensor] = lambda t: t) -> torch.Tensor:
    """One training step's forwards and backwards over ``m`` micro-batches of ``call``
    (``(args, kwargs)``), one micro-batch at a time; returns the batch's loss (detached).

    ``loss(output, k)`` is micro-batch ``k``'s mean loss; each backward runs on it times the
    micro-batch's share of the batch, so the gradients sum to the full batch's. The backwards
    of all micro-batches but the last run inside ``no_sync()``. Each forward and loss run
    inside ``autocast()``, each backward on ``scale(loss)`` (``amp``: :mod:`memflow.export.amp`).
    """
    parts = micro_batches(*call, m)
    rows = [next((t.shape[0] for t in pytree.tree_leaves(p) if isinstance(t, torch.Tensor)
                  and t.dim()), 1) for p in parts]
    total = None
    for k, (args, kwargs) in enumerate(parts):
        with no_sync() if k < m - 1 else contextlib.nullcontext():
            with autocast():
                part = loss(model(*args, **kwargs), k) * (rows[k] / sum(rows))
            scale(part).backward()
        total = part.detach() if total is None else total + part.detach()
    return total
