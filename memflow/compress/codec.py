"""Which compressor packs a feature map: SZ3 where it can run, memflow's quantizer elsewhere.

:func:`compress` and :func:`decompress` are the front door that the ``compress`` policy's hooks
(:mod:`~memflow.compress.hooks`, ``memflow.export``) and the measured ratios of the compression
planner go through. ``compressor`` names one of :data:`COMPRESSORS`:

* ``"sz3"``: the real SZ3 (:mod:`~memflow.compress.sz3`, the optional ``pysz`` package), what
  COMET compresses with — prediction, quantization, Huffman and a lossless stage; CPU only;
* ``"quantizer"``: memflow's fixed-width quantizer (:mod:`~memflow.compress.quantizer`), in
  torch ops on any device — the GPU path, and the fallback without pysz.

The default (``None``) is SZ3 for a CPU tensor when pysz is installed, else the quantizer. Both
honour the bound element by element; :attr:`Packed.compressor` says which one packed a map.

>>> import torch
>>> x = torch.relu(torch.randn(256, 64))
>>> p = compress(x, 1e-2, compressor="quantizer")
>>> p.compressor, bool((decompress(p) - x).abs().max() <= 1e-2)
('quantizer', True)
>>> choose(torch.device("meta"))
'quantizer'
"""
from __future__ import annotations

import torch

from ..errors import CompressionError
from . import quantizer, sz3
from .quantizer import Packed

__all__ = ["compress", "decompress", "choose", "COMPRESSORS"]

COMPRESSORS = ("sz3", "quantizer")


def choose(device: torch.device | str, compressor: str | None = None) -> str:
    """The compressor used for a tensor on ``device``: ``compressor`` itself when given (checked),
    else ``"sz3"`` on the CPU with pysz installed, ``"quantizer"`` otherwise."""
    if compressor is None:
        return "sz3" if torch.device(device).type == "cpu" and sz3.available() else "quantizer"
    if compressor not in COMPRESSORS:
        raise CompressionError(f"compressor must be one of {', '.join(COMPRESSORS)} "
                               f"(or None: the best available), got {compressor!r}")
    return compressor


def compress(tensor: torch.Tensor, error_bound: float, *, relative: bool = False,
             lossless: bool = False, compressor: str | None = None) -> Packed:
    """Compress ``tensor`` so that every element comes back within ``error_bound``.

    ``relative``: the bound is ``error_bound · (max - min)`` of the finite values.
    ``lossless``: the quantizer's zlib stage (SZ3 always ends with its own lossless stage).
    ``compressor``: see :func:`choose`.
    """
    if choose(getattr(tensor, "device", "cpu"), compressor) == "sz3":
        return sz3.compress(tensor, error_bound, relative=relative)
    return quantizer.compress(tensor, error_bound, relative=relative, lossless=lossless)


def decompress(packed: Packed) -> torch.Tensor:
    """The tensor back, whichever compressor packed it."""
    return (sz3.decompress if packed.compressor == "sz3" else quantizer.decompress)(packed)
