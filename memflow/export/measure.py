"""Measure what a model really holds for backward at the end of its forward.

``memflow.graph.measure`` counts what autograd *saves* in a plain forward (its pack hooks see
every saved tensor). Under export's policies that is not what stays in memory: a recompute
segment saves holders and keeps its inputs in a closure, an offloading unit keeps host copies,
a compressing one packed bytes — and those policies install their own ``saved_tensors_hooks``,
which hide the saves from an outer hook. So :func:`held_bytes` measures the result instead:

* a ``TorchDispatchMode`` notes every storage an op allocates during the forward (a storage
  that none of the op's inputs had), by weak reference. A tensor subclass (a DTensor) is seen
  through: the mode sees the op on the DTensor, never the local op it runs, so the storages
  counted are those of its inner (local) tensors;
* then everything but the autograd graph is dropped — the outputs, and the inputs, which are
  copies made here — and the storages still alive are the ones the graph holds: exactly
  "bytes held for backward at the end of forward, each storage once" of the memory model.
  Parameters and buffers are not counted.

Host copies made by an :class:`~memflow.export.exported.Exported` model's offloading units are
counted apart (on a machine without GPU the host and the device are both ``cpu``).

>>> import torch
>>> from torch import nn
>>> model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
>>> held_bytes(model, torch.randn(8, 16))     # the input and the ReLU output, as saved_bytes
{'cpu': 1536}
"""
from __future__ import annotations

import contextlib
import gc
import time
from typing import Any, Callable, ContextManager

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass

from ..graph.capture import split_inputs
from .segment import storage_key

__all__ = ["held_bytes", "HOST"]

HOST = "host"
"""Key of offloaded bytes in :func:`held_bytes`'s result."""


def _plain(tree) -> list[torch.Tensor]:
    """The plain tensors of ``tree``, a tensor subclass (DTensor) replaced by its inner ones."""
    out = []
    todo = list(pytree.tree_leaves(tree))
    while todo:
        t = todo.pop()
        if is_traceable_wrapper_subclass(t):
            todo += [x for x in map(t.__getattribute__, t.__tensor_flatten__()[0])
                     if isinstance(x, torch.Tensor)]
        elif isinstance(t, torch.Tensor):
            out.append(t)
    return out


_COLLECTIVES = ("_c10d_functional", "c10d")
"""Namespaces of the collective ops whose outputs a gloo ``Work`` object may still hold."""

SETTLE_S = 0.25
"""How long :func:`held_bytes` waits at most for a collective's worker thread to let go of
outputs the forward has dropped."""


class _Allocations(TorchDispatchMode):
    """Weak references to every storage an op allocates while the mode is on, and the keys of
    the storages FSDP2's own ops touch (``comm``)."""

    def __init__(self) -> None:
        super().__init__()
        self.made: dict[int, tuple[StorageWeakRef, int, str]] = {}
        self.comm: set[int] = set()
        self.collective: set[int] = set()

    def note(self, t: torch.Tensor) -> None:
        for t in _plain(t):
            storage = t.untyped_storage()
            if storage._cdata not in self.made:
                self.made[storage._cdata] = (StorageWeakRef(storage), storage.nbytes(),
                                             str(t.device))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        seen = {storage_key(t) for t in _plain((args, kwargs))}
        if func.namespace == "fsdp":
            # FSDP2's all-gather buffers (``fsdp::all_gather_copy_in``, ``split_with_sizes_copy``)
            # are model states, never activations. Reading them from FSDP2's state at count time
            # is not enough: the flat output of an asynchronous gloo all-gather can outlive that
            # state while its Work object lives, so a loaded machine counted 1 KiB as held.
            self.comm |= seen | {storage_key(t) for t in _plain(out)}
        elif func.namespace in _COLLECTIVES:
            self.collective |= {storage_key(t) for t in _plain(out)} - seen
        for t in _plain(out):
            if storage_key(t) not in seen:
                self.note(t)
        return out


def _copy_inputs(example_inputs: Any) -> tuple[tuple, dict]:
    args, kwargs = split_inputs(example_inputs)
    return pytree.tree_map_only(
        torch.Tensor, lambda t: t.detach().clone().requires_grad_(t.requires_grad), (args, kwargs))


def held_bytes(model: nn.Module, example_inputs: Any, *, forwards: int = 1,
               skip: Callable[[], set[int]] = set,
               then: Callable[[list[torch.Tensor]], None] | None = None,
               autocast: Callable[[], ContextManager] = contextlib.nullcontext) -> dict[str, int]:
    """Bytes the autograd graph of one forward of ``model`` holds, by device (see module doc).

    ``example_inputs`` as for :func:`memflow.from_torch`; they are copied, so the caller's
    tensors are not what is counted. Offloaded host copies are under :data:`HOST`.

    Across processes (:mod:`memflow.export.rank_validation`) a rank also needs: ``forwards``
    graphs held at once (a pipeline stage's micro-batches in flight), ``skip()`` — storage keys
    that are no activations, asked at count time (tied weights tensor parallelism gathers;
    FSDP2's all-gather buffers are told by the ops that make them) — and
    ``then(probes)``, called after counting with one scalar per forward whose backward runs
    through every graph (so that DistributedDataParallel or FSDP2 finish their step). Storages
    a hook resized to nothing (FSDP2 frees a gathered weight so) are not counted. Each
    forward runs inside ``autocast()`` (the ``amp`` precision's, :mod:`memflow.export.amp`).
    """
    weights = {storage_key(t) for t in _plain([*model.parameters(), *model.buffers()])}
    mode = _Allocations()
    outs, probes = [], []
    for _ in range(forwards):
        args, kwargs = _copy_inputs(example_inputs)
        pytree.tree_map_only(torch.Tensor, mode.note, (args, kwargs))
        with mode, autocast():
            out = model(*args, **kwargs)
        leaves = [t for t in pytree.tree_leaves(out)
                  if isinstance(t, torch.Tensor) and t.grad_fn is not None]
        outs.append([t.grad_fn for t in leaves])
        if then is not None:     # a sum's backward saves no input: nothing more is held
            probes.append(sum(t.float().sum() for t in leaves if t.is_floating_point()))
        del out, leaves, args, kwargs
    # an Exported model's offload store, also under DistributedDataParallel (``.module``)
    store = getattr(model, "store", None) or getattr(getattr(model, "module", None), "store", None)
    host = {ref.cdata for ref in getattr(store, "host_made", [])}
    # a full collection: an automatic one during the forward can promote its dead cycles to
    # the oldest generation, where a young collection leaves them counted (+512 B, now and
    # then, on a tensor-parallel rank)
    gc.collect()
    weights |= skip() | mode.comm
    _settle(mode, weights)
    totals: dict[str, int] = {}
    for key, (ref, nbytes, device) in mode.made.items():
        if ref.expired() or key in weights or not _size_now(ref):
            continue
        where = HOST if key in host else device
        totals[where] = totals.get(where, 0) + nbytes
    del outs
    if then is not None:
        then(probes)
    return totals


def _settle(mode: _Allocations, weights: set[int]) -> None:
    """Wait (at most :data:`SETTLE_S`) until no collective output the forward dropped is alive.

    gloo completes a collective's future on its worker thread *before* that thread drops its
    ``Work`` object, which holds the output: on a loaded machine the forward can end inside
    that window, and an all-reduced activation nobody saved was counted as held (+768 B on a
    tensor-parallel rank, in CI). An output autograd really saved never expires, so this
    waits the full time only on ranks whose graph keeps a collective's output.
    """
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline and any(
            not mode.made[key][0].expired() for key in mode.collective - weights
            if key in mode.made):
        time.sleep(0.005)


def _size_now(ref: StorageWeakRef) -> int:
    """The bytes a live storage has now."""
    return torch.UntypedStorage._new_with_weak_ptr(ref.cdata).nbytes()
