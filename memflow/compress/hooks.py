"""Compress what autograd saves for backward: a ``saved_tensors_hooks`` context.

Inside ``with compressed_saved_tensors(eb):`` every floating tensor an op saves for backward
is packed by :func:`~memflow.compress.codec.compress` (SZ3 on the CPU when pysz is installed,
memflow's quantizer otherwise; ``compressor`` picks one) and unpacked when backward needs it,
so the forward keeps only the compressed bytes. Parameters (and views of them), integer and
bool tensors (masks, indices), tensors smaller than ``min_numel`` and storages listed in
``skip`` are saved as they are. A storage saved twice by one forward (a ReLU output read by
the next layer's matmul, say) is compressed once, as autograd would store it once.

The export layer scopes the context to the units whose policy is ``compress``.

>>> import torch
>>> net = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
>>> x = torch.randn(256, 32)
>>> with compressed_saved_tensors(1e-3) as hooks:
...     loss = net(x).sum()
>>> loss.backward()
>>> hooks.tensors, hooks.ratio > 2
(2, True)
"""
from __future__ import annotations

import weakref
from typing import Any, Iterable

import torch

from .codec import choose, compress, decompress
from .quantizer import FLOAT_DTYPES, Packed

__all__ = ["compressed_saved_tensors"]


def _is_parameter(t: torch.Tensor) -> bool:
    # Linear saves weight.t(): a view whose base is the Parameter
    return isinstance(t, torch.nn.Parameter) or isinstance(t._base, torch.nn.Parameter)


class compressed_saved_tensors(torch.autograd.graph.saved_tensors_hooks):
    """Context manager: saved floating activations are stored compressed within ``error_bound``.

    ``relative``, ``lossless`` and ``compressor`` are passed to :func:`compress`. Counters after (or during)
    the forward: ``tensors`` compressed, ``skipped``, ``bytes_in`` (their original bytes) and
    ``bytes_out`` (compressed); ``ratio`` = bytes_in / bytes_out.
    """

    def __init__(self, error_bound: float, *, relative: bool = False, lossless: bool = False,
                 compressor: str | None = None, min_numel: int = 64,
                 skip: Iterable[torch.Tensor] = ()) -> None:
        # fail now, not inside autograd, on a bad bound or compressor
        compress(torch.zeros(1), error_bound, compressor=choose("cpu", compressor))
        self.error_bound, self.relative, self.lossless = error_bound, relative, lossless
        self.compressor = compressor
        self.min_numel = int(min_numel)
        self._skip = {t.untyped_storage().data_ptr() for t in skip}
        self.tensors = self.skipped = self.bytes_in = self.bytes_out = 0
        # (storage, offset, shape, stride, dtype, version) -> (weakref to tensor, Packed)
        self._seen: dict[tuple, tuple[weakref.ref, Packed]] = {}
        super().__init__(self._pack, self._unpack)

    @property
    def ratio(self) -> float:
        """Original bytes / compressed bytes over the tensors compressed so far."""
        return self.bytes_in / self.bytes_out if self.bytes_out else 1.0

    def _keep(self, t: torch.Tensor) -> bool:
        return (t.dtype not in FLOAT_DTYPES or t.layout != torch.strided
                or t.device.type == "meta" or t.numel() < self.min_numel or _is_parameter(t)
                or t.untyped_storage().data_ptr() in self._skip)

    def _pack(self, t: torch.Tensor) -> Any:
        if self._keep(t):
            self.skipped += 1
            return t
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(),
               t.dtype, t._version)
        hit = self._seen.get(key)
        # a live weak reference proves the storage was not freed and its address reused
        if hit is not None and hit[0]() is not None:
            return hit[1]
        packed = compress(t, self.error_bound, relative=self.relative, lossless=self.lossless,
                          compressor=self.compressor)
        self._seen[key] = (weakref.ref(t), packed)
        self.tensors += 1
        self.bytes_in += packed.original_bytes
        self.bytes_out += packed.nbytes
        return packed

    @staticmethod
    def _unpack(saved: Any) -> torch.Tensor:
        return decompress(saved) if isinstance(saved, Packed) else saved

    def __enter__(self) -> "compressed_saved_tensors":
        super().__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._seen.clear()  # the autograd graph holds the packed tensors from here on
        super().__exit__(*exc)
