"""SZ3, the error-bounded compressor COMET builds on, through its Python interface ``pysz``.

SZ3 (Zhao et al., ICDE 2021; Liang et al., IEEE TBD 2022) predicts each value from its
neighbours (interpolation and Lorenzo), quantizes the prediction error on a grid of
``2·bound``, Huffman-codes the quantization codes and ends with a lossless stage (zstd): the
pipeline COMET (Jin et al., VLDB 2022) uses on feature maps, where memflow's own
:mod:`~memflow.compress.quantizer` stores fixed-width codes. ``pysz`` is optional
(``pip install memflow[compress]``); :func:`available` says whether it is installed, and
:mod:`~memflow.compress.codec` falls back to the quantizer without it.

What memflow adds around SZ3's absolute-bound mode, so that its result can replace a saved
activation in backward exactly as the quantizer's does:

* the map is compressed flat (1-D): on the maps of untrained zoo models (resnet50, gpt2) that
  beat the natural 4-D layout and the trailing 2-D or 3-D views by 1–4%, and it takes any rank
  (SZ3 stops at 4);
* **zeros stay zeros** in a map ``>= 0`` that holds zeros (a ReLU's output, whose backward
  tests ``output > 0``): positives are moved up by the bound ``e`` and zeros down to ``-e``
  before compressing, so a reconstruction ``> 0`` was a positive (``y - e`` is then within
  ``e`` of it) and one ``<= 0`` was a zero. SZ3 alone returns ~all zeros as ±tiny values,
  half of them positive. It costs ~2% of the ratio (same maps);
* 16-bit maps go through float32 (pysz takes float32/float64) with room left in the bound for
  the cast back; NaN and ±inf are compressed as zeros;
* the bound is then *checked* element by element on the reconstruction in the map's own dtype,
  as in the quantizer, and every element that misses it (or is not finite) is stored exactly
  as an outlier: the guarantee holds by construction, whatever SZ3's float rounding does;
* the stream is copied into a torch uint8 tensor of its exact size (pysz returns a view of a
  worst-case buffer, which would keep more than the map alive), so memory accounting that
  follows torch storages (``memflow.export``'s validation) sees what is held.

>>> import torch
>>> x = torch.relu(torch.randn(4096, generator=torch.Generator().manual_seed(0)))
>>> if available():
...     p = compress(x, 1e-2)
...     y = decompress(p)
...     ok = bool((y - x).abs().max() <= 1e-2) and torch.equal(y == 0, x == 0)
... else:
...     ok = True
>>> ok
True
"""
from __future__ import annotations

import importlib.util

import numpy as np
import torch

from ..errors import CompressionError
from .quantizer import (HEADER_BYTES, Packed, check_args, finite_range, grid_step, keep_outliers,
                        threshold)
from .quantizer import compress as quantize
from .quantizer import decompress as dequantize

__all__ = ["available", "compress", "decompress", "INSTALL"]

_CHUNK = 1 << 18     # elements shifted or checked at a time: a chunk's scratch, not a map's
INSTALL = "pip install 'memflow[compress]' (or: pip install pysz)"


def available() -> bool:
    """Whether ``pysz`` (SZ3) is installed.

    >>> isinstance(available(), bool)
    True
    """
    return importlib.util.find_spec("pysz") is not None


def _sz():
    try:
        from pysz import sz, szConfig, szErrorBoundMode
    except ImportError:
        raise CompressionError(f"compressor 'sz3' needs pysz, which is not installed: "
                               f"{INSTALL}; or use compressor='quantizer'") from None
    return sz, szConfig, szErrorBoundMode


def compress(tensor: torch.Tensor, error_bound: float, *, relative: bool = False) -> Packed:
    """SZ3-compress a CPU tensor so that every element comes back within ``error_bound``.

    ``relative``: the bound is ``error_bound · (max - min)`` of the finite values. A constant
    map goes to the quantizer (no codes at all: 32 bytes); a map whose stream would not be
    smaller than itself is kept raw. Raises :class:`~memflow.errors.CompressionError` without
    pysz, or for a tensor that is not on the CPU.
    """
    eb = check_args(tensor, error_bound)
    if tensor.device.type != "cpu":
        raise CompressionError(f"compressor 'sz3' runs on the CPU; this tensor is on "
                               f"{tensor.device}: use compressor='quantizer' there")
    sz, config_of, mode = _sz()
    x = tensor.detach()
    flat = x.reshape(-1)
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    values = flat.to(work)
    low, high, finite = finite_range(values)
    bound = eb * (high - low) if relative else eb
    if high == low:
        return quantize(tensor, eb, relative=relative)
    packed = Packed(x.shape, x.dtype, x.device, bound, compressor="sz3")
    half = grid_step(low, high, bound, x.dtype) / 2     # a hair under the bound, cast included
    data = values if finite is None else torch.where(finite, values, 0.0)
    if low == 0.0:   # >= 0 with zeros: keep zeros exact (see the module's notes)
        packed.shift = half
        data = _shifted(data, half)
    config = config_of()
    config.errorBoundMode = mode.ABS
    config.absErrorBound = half
    stream, _ = sz.compress(np.ascontiguousarray(data.numpy()), config)
    del data        # what SZ3 was given: the check below needs only the reconstruction
    if stream.size + HEADER_BYTES >= packed.original_bytes:
        packed.raw = x.clone()
        return packed
    packed.stream = torch.from_numpy(stream).clone()
    recon = _rebuild(packed, sz).to(work)
    miss = _misses(recon, values, threshold(bound, work), bool(packed.shift))
    if finite is not None:
        miss |= ~finite
    keep_outliers(packed, flat, miss)
    return packed


def _shifted(data: torch.Tensor, half: float) -> torch.Tensor:
    """A finite map >= 0 as SZ3 is given it: positives up by ``half``, zeros to ``-half``; made
    a chunk at a time, so that its scratch is a chunk's, not a map's."""
    out = torch.empty_like(data)
    for part, into in zip(data.split(_CHUNK), out.split(_CHUNK)):
        torch.add(part, half, out=into).masked_fill_(part <= 0, -half)
    return out


def _misses(recon: torch.Tensor, values: torch.Tensor, limit: float, shifted: bool
            ) -> torch.Tensor:
    """Where the reconstruction is off by more than ``limit`` (or, ``shifted``, has the wrong
    sign: by construction not, checked like the bound), a chunk at a time."""
    miss = torch.empty(values.shape, dtype=torch.bool)
    for r, v, m in zip(recon.split(_CHUNK), values.split(_CHUNK), miss.split(_CHUNK)):
        torch.gt((r - v).abs_(), limit, out=m)
        if shifted:
            m |= (r > 0) != (v > 0)
    return miss


def _rebuild(packed: Packed, sz) -> torch.Tensor:
    """The reconstruction in the map's dtype, flat, before outliers are put back.

    Built in SZ3's own output buffer: backward holds one decompressed map per autograd node,
    as the memory model charges it; torch ops on the whole map (a shifted copy, a mask, a
    ``where``) once held 3.5 maps at a ReLU's backward."""
    work = np.float64 if packed.dtype == torch.float64 else np.float32
    data, _ = sz.decompress(packed.stream.numpy(), work, (packed.numel,))
    if packed.shift:
        # a positive comes back positive (at least the dtype's smallest normal), the rest zero
        tiny = work(torch.finfo(packed.dtype).tiny)
        for start in range(0, data.size, _CHUNK):
            part = data[start:start + _CHUNK]
            zero = ~(part > 0)
            part -= work(packed.shift)
            np.maximum(part, tiny, out=part)
            part[zero] = 0
    return torch.from_numpy(data).to(packed.dtype)


def decompress(packed: Packed) -> torch.Tensor:
    """The tensor back from :func:`compress`: shape, dtype and device as given, every element
    within the bound."""
    if packed.compressor != "sz3":     # a constant map, handed to the quantizer
        return dequantize(packed)
    if packed.raw is not None:
        return packed.raw
    out = _rebuild(packed, _sz()[0])
    if packed.outlier_index is not None:
        out[packed.outlier_index.long()] = packed.outlier_value
    return out.view(packed.shape)
