"""What ``offload`` and ``compress`` units keep for backward: host images and packed bytes.

:class:`SavedStore` gives the ``saved_tensors_hooks`` each such unit runs under:

* ``offload`` (:meth:`SavedStore.offload`) works like ``torch.autograd.graph.save_on_cpu``
  scoped to the unit, copying to pinned memory without blocking when the tensor is on a GPU;
* ``compress`` (:meth:`SavedStore.compress`) packs floating tensors within the error bound
  (:func:`memflow.compress.compress`: SZ3 on the CPU when pysz is installed, memflow's
  quantizer otherwise — every element within the bound).

Both realise the memory model (``docs/data-model.md``) exactly:

* parameters and buffers stay where they are: they are not activations and stay on the device
  anyway (``save_on_cpu`` would copy every Linear's weight to the host at each step);
* a storage has one host image per forward however many views of it are saved (each view
  copies its own elements into it: an RNN writes its gates into one buffer step by step), and
  backward rebuilds the views on it — the memory model counts storages, not views;
* a storage stays on the device at full size when any unit holding it keeps it or it is a
  recompute segment's input, however many others offload or compress it. :meth:`hold` is told
  of such storages (the :meth:`observer` sees what ``keep`` units save): a copy made before is
  dropped and its views rebuilt on the device storage; none is made after;
* the step's inputs stay as they are under ``compress``: the caller holds them through the
  step, so a pack of one would only add its bytes (:meth:`reset` is told of them).

>>> import torch
>>> store = SavedStore(state=set())
>>> x = torch.randn(4, 4, requires_grad=True)
>>> with store.offload():
...     y = (x * 2).sin()               # sin saves its input, x * 2
>>> y.sum().backward()
>>> len(store.records), torch.allclose(x.grad, 2 * (x * 2).cos())
(1, True)
"""
from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from .segment import storage_key

__all__ = ["SavedStore"]

_Hooks = torch.autograd.graph.saved_tensors_hooks


class _Record:
    """One storage: its host image, its compressed views, or the device storage once held.

    ``packs`` refers to the compressed views weakly: the graph holds them, and a view backward
    has used is freed at once, as PyTorch frees a saved tensor (a strong list made a cycle with
    :attr:`_Saved.record` that only a garbage collection broke, so every pack lived on through
    backward and the optimizer step)."""

    __slots__ = ("ref", "host", "device", "packs")

    def __init__(self, t: torch.Tensor):
        self.ref = StorageWeakRef(t.untyped_storage())
        self.host: torch.Tensor | None = None
        self.device: torch.Tensor | None = None
        self.packs: list[weakref.ref] = []

    def live_packs(self) -> list["_Saved"]:
        return [s for s in (ref() for ref in self.packs) if s is not None]


class _Saved:
    """A saved view of a recorded storage: rebuilt from the device storage, the host image,
    or its compressed pack."""

    __slots__ = ("record", "pack", "unpack", "device", "dtype", "offset", "size", "stride",
                 "__weakref__")

    def __init__(self, record: _Record, t: torch.Tensor, pack: Any = None, unpack: Any = None):
        self.record, self.pack, self.unpack = record, pack, unpack
        self.device, self.dtype = t.device, t.dtype
        self.offset, self.size, self.stride = t.storage_offset(), t.size(), t.stride()

    @property
    def view(self) -> tuple:
        return self.offset, tuple(self.size), self.stride, self.dtype

    def restore(self) -> torch.Tensor:
        if self.pack is not None:
            return self.unpack(self.pack)
        data = self.record.device
        if data is None:
            data = self.record.host.to(self.device, non_blocking=True)
        return torch.empty(0, dtype=self.dtype, device=self.device).set_(
            data.untyped_storage(), self.offset, self.size, self.stride)


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    """The whole storage of ``t`` as a flat uint8 tensor (no copy)."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def _restore(saved: Any) -> torch.Tensor:
    return saved.restore() if isinstance(saved, _Saved) else saved


class SavedStore:
    """The offload and compress hooks of one model; ``state`` = storage keys of its
    parameters and buffers. :meth:`reset` at the start of each forward."""

    def __init__(self, state: set[int]):
        self.state = state
        self.records: dict[int, _Record] = {}
        self.held: set[int] = set()
        self.inputs: set[int] = set()
        self.host_made: list[StorageWeakRef] = []     # host images of this forward (measuring)

    def reset(self, inputs: Any = ()) -> None:
        """Forget the previous forward (its graph holds what it still needs); ``inputs``: the
        tensors of the forward starting now."""
        self.records.clear()
        self.held.clear()
        self.inputs = {storage_key(t) for t in inputs if isinstance(t, torch.Tensor)}
        self.host_made = []

    def observer(self) -> _Hooks:
        """The context around the whole forward: what units without a policy context save
        (``keep``) stays on the device."""
        return _Hooks(self._kept, _restore)

    def _kept(self, t: torch.Tensor) -> torch.Tensor:
        self.hold(t)
        return t

    def hold(self, t: torch.Tensor) -> None:
        """``t``'s storage stays on the device for backward."""
        key = storage_key(t)
        self.held.add(key)
        record = self.records.get(key)
        if record is not None and not record.ref.expired():
            record.device, record.host = _bytes_of(t), None
            for saved in record.live_packs():
                saved.pack = None
            record.packs = []

    def _record(self, t: torch.Tensor) -> _Record | None:
        """The record of ``t``'s storage, or None when it stays as it is."""
        key = storage_key(t)
        if key in self.state or key in self.held:
            return None
        record = self.records.get(key)
        if record is None or record.ref.expired():    # expired: a new storage, reused address
            record = self.records[key] = _Record(t)
        return record

    def offload(self) -> _Hooks:
        """The context under which an offloading unit runs."""
        return _Hooks(self._offload, _restore)

    def _offload(self, t: torch.Tensor) -> Any:
        record = self._record(t)
        if record is None:
            return t
        pinned = t.device.type == "cuda"
        if record.host is None and record.device is None:
            record.host = torch.empty(t.untyped_storage().nbytes(), dtype=torch.uint8,
                                      device="cpu", pin_memory=pinned)
            self.host_made.append(StorageWeakRef(record.host.untyped_storage()))
        if record.host is not None:
            # This view's elements into the host image (an expanded view repeats elements:
            # stride 0, copied once).
            size = [1 if st == 0 else n for n, st in zip(t.size(), t.stride())]
            image = record.host.view(t.dtype).as_strided(size, t.stride(), t.storage_offset())
            image.copy_(t.detach().as_strided(size, t.stride()), non_blocking=pinned)
        return _Saved(record, t)

    def compress(self, error_bound: float) -> _Hooks:
        """The context under which a unit compressing within ``error_bound`` runs."""
        from ..compress import FLOAT_DTYPES, compress, decompress

        def pack(t: torch.Tensor) -> Any:
            record = None if storage_key(t) in self.inputs else self._record(t)
            if record is None or t.dtype not in FLOAT_DTYPES or t.layout != torch.strided:
                return t    # weights, held storages, inputs, integers and masks stay as they are
            view = (t.storage_offset(), tuple(t.size()), t.stride(), t.dtype)
            for saved in record.live_packs():   # the same view saved twice is packed once
                if saved.view == view:
                    return saved
            saved = _Saved(record, t, compress(t.detach(), error_bound), decompress)
            record.packs.append(weakref.ref(saved))
            return saved

        return _Hooks(pack, _restore)
