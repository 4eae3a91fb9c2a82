"""Measure the compressor on one tensor: ratios, the error reached, bits, and speed.

>>> import torch
>>> x = torch.relu(torch.linspace(-3, 3, 16384))
>>> m = measure(x, 1e-2)
>>> bool(m["max_error"] <= 1e-2), int(m["bits"]), bool(m["ratio_lossless"] > m["ratio"])
(True, 8, True)
"""
from __future__ import annotations

import time

import pandas as pd
import torch

from .quantizer import compress, decompress

__all__ = ["measure"]


def _timed(fn, device: torch.device):
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    out = fn()
    sync()
    return out, time.perf_counter() - start


def measure(tensor: torch.Tensor, error_bound: float, *, relative: bool = False) -> pd.Series:
    """Compress ``tensor`` twice (bit planes alone, then with zlib) and report.

    ``ratio``: original / compressed bytes of the quantizer alone (what a GPU would hold);
    ``ratio_lossless``: with the zlib stage. ``max_error`` is measured, ``error_bound`` is the
    absolute bound (``error_bound · range`` when ``relative``). ``throughput`` and
    ``decompress_throughput`` are original bytes per second of the quantizer alone.
    """
    packed, t_c = _timed(lambda: compress(tensor, error_bound, relative=relative),
                         tensor.device)
    back, t_d = _timed(lambda: decompress(packed), tensor.device)
    zipped = compress(tensor, error_bound, relative=relative, lossless=True)
    finite = torch.isfinite(tensor)
    err = (back.double() - tensor.double()).abs()[finite]
    size = packed.original_bytes
    return pd.Series({
        "numel": packed.numel, "bytes": size, "dtype": str(tensor.dtype).replace("torch.", ""),
        "error_bound": packed.error_bound, "bits": packed.bits,
        "max_error": float(err.max()) if err.numel() else 0.0,
        "outliers": packed.outliers, "ratio": packed.ratio, "ratio_lossless": zipped.ratio,
        "compress_s": t_c, "decompress_s": t_d,
        "throughput": size / t_c if t_c else float("inf"),
        "decompress_throughput": size / t_d if t_d else float("inf"),
    }, name="measure")
