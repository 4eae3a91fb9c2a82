"""Which storages scale with the batch: the rule behind the ``tensors`` table's ``per_sample``.

A storage is *per-sample* — a sample split or micro-batching divides it — when it descends from
a per-sample input through ops that keep the batch (:func:`keeps_batch`, the recorder's taint)
and one of its dimensions is a multiple of the batch (:func:`carries_batch`: ``(N, …)``,
flattened ``(N·S, H)``, sequence-first ``(S, N, H)``; not a scalar loss). Ops that drop the
batch:

* batch norm's statistics (``save_mean``, ``save_invstd``: one per channel) reduce over every
  axis but the channels, so they are per-sample only where the batch is folded into the
  channels (``instance_norm`` runs batch norm on ``(1, N·C, …)``);
* a reduction over the batch axis (``x.mean(0)``, ``x.sum([0, 2])``);
* ``new_zeros``, ``new_ones``… take only a dtype and a device from their tensor: their output is
  per-sample, as a model input is, when its leading dimension is the batch (a causal mask
  ``x.new_ones(S, S)`` is not).

The batch axis of a tensor is its first dimension that is a multiple of the batch. A contraction
over the batch (``x.T @ x``) whose result has such a dimension is not recognised.
"""
from __future__ import annotations

from typing import Sequence

import torch

__all__ = ["batch_axis", "carries_batch", "keeps_batch"]

# batch norm in its aten forms: output 0 is the normalised input, the others per channel
_BATCH_NORMS = frozenset({
    "native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_functional",
    "_native_batch_norm_legit_no_training", "cudnn_batch_norm", "miopen_batch_norm"})
_FACTORIES = frozenset({"new_empty", "new_empty_strided", "new_zeros", "new_ones", "new_full"})


def batch_axis(shape: Sequence[int], batch: int) -> int | None:
    """The first dimension of ``shape`` that is a multiple of ``batch`` (None if none).

    >>> batch_axis((4, 3, 8, 8), 4), batch_axis((1, 12, 5, 5), 4), batch_axis((6,), 4)
    (0, 1, None)
    """
    return next((i for i, d in enumerate(shape) if d >= batch and d % batch == 0), None)


def carries_batch(shape: Sequence[int], batch: int) -> bool:
    """Whether a storage of ``shape`` can hold a batch of ``batch`` samples.

    >>> carries_batch((8, 5), 4), carries_batch((), 4), carries_batch((3, 3), 4)
    (True, False, False)
    """
    return batch_axis(shape, batch) is not None


def keeps_batch(func, args: tuple, kwargs: dict, source: torch.Tensor, index: int,
                out: torch.Tensor, batch: int) -> bool:
    """Whether output ``index`` (``out``) of the aten op ``func``, which read the per-sample
    tensor ``source``, still holds the batch.

    >>> aten, x = torch.ops.aten, torch.zeros(4, 4, 6, 6)
    >>> stats = torch.zeros(4)
    >>> keeps_batch(aten.native_batch_norm.default, (x,), {}, x, 1, stats, 4)
    False
    >>> keeps_batch(aten.native_batch_norm.default, (x,), {}, x, 0, x, 4)
    True
    >>> keeps_batch(aten.mean.dim, (x, [0]), {}, x, 0, torch.zeros(4, 6, 6), 4)
    False
    """
    name = func._schema.name.split("::")[-1]
    if name in _FACTORIES:
        return out.dim() > 0 and out.shape[0] == batch
    axis = batch_axis(source.shape, batch)
    if name in _BATCH_NORMS and index > 0:
        return axis == 1
    if out.numel() < source.numel():
        dims = _reduced_dims(func, args, kwargs, source.dim())
        return axis is None or axis not in dims
    return True


def _reduced_dims(func, args: tuple, kwargs: dict, ndim: int) -> set[int]:
    """The dimensions named by the op's ``dim`` argument, made non-negative (empty if none)."""
    for i, a in enumerate(func._schema.arguments):
        if a.name == "dim":
            dim = args[i] if i < len(args) else kwargs.get("dim")
            if dim is None or ndim == 0:
                return set()
            dims = [dim] if isinstance(dim, int) else list(dim)
            return {d % ndim for d in dims}
    return set()
