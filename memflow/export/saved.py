"""Offload: what an ``offload`` unit saves for backward waits in host memory.

Like ``torch.autograd.graph.save_on_cpu``, scoped to the units that offload, with two
differences that make it realise the memory model exactly (``docs/data-model.md``):

* parameters and buffers are left where they are: they are not activations and stay on the
  device anyway (``save_on_cpu`` would copy the weights of every Linear to the host each step);
* a storage has one host image per forward however many views of it are saved (each saved view
  copies its own elements into it), and the views are rebuilt on it in backward — the memory
  model counts storages, not views.

The copy goes to pinned memory without blocking the host when the tensor is on a GPU; in
backward each unpack brings its storage back to the device it came from.

>>> import torch
>>> store = HostStore(state=set())
>>> x = torch.randn(4, 4, requires_grad=True)
>>> with store.hooks():
...     y = (x * 2).sin()               # sin saves its input, x * 2
>>> y.sum().backward()
>>> len(store.copies), torch.allclose(x.grad, 2 * (x * 2).cos())
(1, True)
"""
from __future__ import annotations

from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from .segment import storage_key

__all__ = ["HostStore", "Offloaded"]


class _HostCopy:
    """One storage's host copy, or the device storage itself once something holds it there."""

    __slots__ = ("ref", "host", "device")

    def __init__(self, ref: StorageWeakRef, host: torch.Tensor):
        self.ref, self.host, self.device = ref, host, None


class Offloaded:
    """A saved tensor whose storage waits on the host: the copy and how to rebuild the view."""

    __slots__ = ("copy", "device", "dtype", "offset", "size", "stride")

    def __init__(self, copy: _HostCopy, t: torch.Tensor):
        self.copy = copy
        self.device, self.dtype = t.device, t.dtype
        self.offset, self.size, self.stride = t.storage_offset(), t.size(), t.stride()

    def restore(self) -> torch.Tensor:
        """The saved tensor, on its device again."""
        data = self.copy.device
        if data is None:
            data = self.copy.host.to(self.device, non_blocking=True)
        return torch.empty(0, dtype=self.dtype, device=self.device).set_(
            data.untyped_storage(), self.offset, self.size, self.stride)


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    """The whole storage of ``t`` as a flat uint8 tensor (no copy)."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


class HostStore:
    """The offloading ``saved_tensors_hooks`` of one model; ``state`` = storage keys of its
    parameters and buffers. :meth:`reset` at the start of each forward.

    The memory model keeps a storage on the device when any unit holding it keeps it (or it
    is a recompute segment's input), however many others offload it. :meth:`hold` is told of
    those storages: one offloaded before is brought back to its device storage (the host copy
    is dropped), one offloaded later is not copied.
    """

    def __init__(self, state: set[int]):
        self.state = state
        self.copies: dict[int, _HostCopy] = {}
        self.held: set[int] = set()
        self.made: list[StorageWeakRef] = []    # host copies of this forward (for measuring)

    def reset(self) -> None:
        """Forget the previous forward's copies (its graph holds what it still needs)."""
        self.copies.clear()
        self.held.clear()
        self.made = []

    def hooks(self) -> torch.autograd.graph.saved_tensors_hooks:
        """The context under which an offloading unit runs."""
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)

    def observer(self) -> torch.autograd.graph.saved_tensors_hooks:
        """The context around the whole forward: what units without a policy context save
        (``keep``) stays on the device."""
        return torch.autograd.graph.saved_tensors_hooks(self._kept, self.unpack)

    def hold(self, t: torch.Tensor) -> None:
        """``t``'s storage stays on the device for backward."""
        key = storage_key(t)
        self.held.add(key)
        copy = self.copies.get(key)
        if copy is not None and not copy.ref.expired():
            copy.device, copy.host = _bytes_of(t), None

    def _kept(self, t: torch.Tensor) -> torch.Tensor:
        if self.copies:
            self.hold(t)
        else:
            self.held.add(storage_key(t))
        return t

    def pack(self, t: torch.Tensor) -> Any:
        key = storage_key(t)
        if key in self.state or key in self.held:
            return t
        copy = self.copies.get(key)
        pinned = t.device.type == "cuda"
        if copy is None or copy.ref.expired():    # expired: a new storage at a reused address
            host = torch.empty(t.untyped_storage().nbytes(), dtype=torch.uint8, device="cpu",
                               pin_memory=pinned)
            copy = self.copies[key] = _HostCopy(StorageWeakRef(t.untyped_storage()), host)
            self.made.append(StorageWeakRef(host.untyped_storage()))
        if copy.host is not None:
            # Copy this view's elements into the storage's host image: other parts of the
            # storage may still change (an RNN writes its gates into one buffer step by step).
            # An expanded view repeats elements (stride 0): copy each element once.
            size = [1 if st == 0 else n for n, st in zip(t.size(), t.stride())]
            image = copy.host.view(t.dtype).as_strided(size, t.stride(), t.storage_offset())
            image.copy_(t.detach().as_strided(size, t.stride()), non_blocking=pinned)
        return Offloaded(copy, t)

    @staticmethod
    def unpack(packed: Any) -> torch.Tensor:
        return packed.restore() if isinstance(packed, Offloaded) else packed
