"""What the simulator charges for the ``compress`` policy: the ratio a bound buys, and the speed.

**Ratio.** :func:`expected_ratio` interpolates bits per element measured by
``benchmarks/bench_compress.py`` (section "compress" of ``benchmarks/RESULTS.md``) on the
feature maps autograd saves in real CPU training forwards of zoo models (resnet50 at 96 px,
vgg16 at 64 px, gpt2 and bert-base with 2 layers at 128 tokens; zoo weights; fp32; outliers
and headers counted; 58 MB of maps),
pooled over all their bytes. Between measured bounds it is linear in log(bound); tighter than
measured it adds log2(10) bits per decade (a uniform quantizer needs one more bit each time
the bound halves); looser, it stays at the loosest measured figure (conservative). The ratio
is ``dtype bits / bits``, and 1 where the quantizer would store maps raw (codes wider than 23
bits, or than the dtype less one).

**Ratio per map kind and compressor.** One pooled figure misses the maps a step holds: at an
absolute bound of 1e-2 SZ3 packs a ReLU map about 5x, a softmax's probabilities tens of
times, and a signed map whose spread grew with the weights (a convolution's output before
batch norm after an SGD step) under 3x. ``kind`` (``memflow.graph.mapkind.MAP_KINDS``,
which capture records per saved storage) picks the bits measured on that kind of map alone
(:data:`BY_KIND`, same benchmark, subsection "By map kind"), and ``compressor`` the
compressor the step runs (:func:`~memflow.compress.codec.choose`: SZ3 on a CPU where pysz
is installed, the quantizer on a GPU or without it), so that the memory model charges each
saved record what the exported hooks will hold. Without ``kind``, the maps pooled.

**Ratio measured on the model itself.** The zoo's figures are pooled over other models' maps:
a raw signed map's spread is its own weights' (inception_v3's batch-norm inputs pack 4.4-5x
where the zoo's signed maps pack 6x). ``measured`` (bits per element by kind and bound, of
one compressor: :func:`memflow.planners.compress_measure.map_bits` compresses the maps a
real forward of the model saves, before any run) replaces the table for the kinds it has.

**Speed.** The quantizer is a chain of memory-bound elementwise torch ops, so on a GPU its time
is its memory traffic over the achieved bandwidth, plus a launch per op. The benchmark counts
that traffic with a dispatch mode — bytes read and written by every op, per element, at each
code width ``bits`` — and :func:`throughput` divides. It is memflow's own unfused
implementation, so it is conservative: a fused kernel (cuSZ-style) reads the map once.
``THROUGHPUT`` is the figure for a V100 (900 GB/s at 0.88) at the default bound of 1e-2: about
28 GB/s. For scale, cuSZ — SZ on the GPU, with COMET's prediction, quantization and Huffman
stages (Tian et al., "cuSZ: An Efficient GPU-Based Error-Bounded Lossy Compression Framework
for Scientific Data", PACT 2020) — reports compression up to 370.1x faster than SZ on one CPU
core and 13.1x faster than on multiple cores, on V100s; SZ3 runs at about 0.1 GB/s on one core
of this machine (pysz alone, unloaded), which puts a cuSZ-class GPU compressor in the same tens of GB/s as
this model. memflow charges its own quantizer's traffic, not cuSZ's, because that is the code
an exported step runs.

>>> round(expected_ratio(1e-2), 1), round(expected_ratio(1e-2, "float16"), 1)
(4.3, 2.2)
>>> expected_ratio(1e-2, kind="probability") > expected_ratio(1e-2, kind="signed")
True
>>> expected_ratio(1e-9) == 1.0
True
>>> round(throughput(900e9, bits=8) / 1e9)
28
"""
from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from ..errors import CompressionError
from .codec import COMPRESSORS

__all__ = ["expected_ratio", "throughput", "launches", "MEASURED", "BY_KIND", "TRAFFIC", "OPS",
           "THROUGHPUT", "DEFAULT_ERROR_BOUND"]

DEFAULT_ERROR_BOUND = 1e-2

# error bound -> bits per element, pooled over all maps, keyed by (relative, lossless). From
# `python benchmarks/bench_compress.py` (RESULTS.md, section "compress"), 2026-11-27.
MEASURED: dict[tuple[bool, bool], dict[float, float]] = {
    (False, False): {1e-1: 4.234, 3e-2: 6.016, 1e-2: 7.403, 3e-3: 9.069, 1e-3: 10.82,
                     1e-4: 14.05},
    (False, True): {1e-1: 2.904, 3e-2: 4.177, 1e-2: 5.314, 3e-3: 6.761, 1e-3: 8.054,
                    1e-4: 10.88},
    (True, False): {1e-1: 3.007, 1e-2: 6.007, 1e-3: 9.007, 1e-4: 13.007},
    (True, True): {1e-1: 1.537, 1e-2: 4.09, 1e-3: 6.874, 1e-4: 9.515},
}

# (compressor, map kind or "all" for every map) -> absolute error bound -> bits per element.
# From `python benchmarks/bench_compress.py` (RESULTS.md, section "compress", "By map kind";
# "all": the pooled `bits` and `sz3_bits` columns), 2026-11-27.
BY_KIND: dict[tuple[str, str], dict[float, float]] = {
    ("quantizer", "all"): MEASURED[(False, False)],
    ("sz3", "all"): {1e-1: 2.927, 3e-2: 4.153, 1e-2: 5.338, 3e-3: 6.717, 1e-3: 8.039,
                     1e-4: 11.08},
    ("sz3", "signed"): {1e-1: 2.863, 3e-2: 4.136, 1e-2: 5.346,
                        3e-3: 6.702, 1e-3: 7.979, 1e-4: 10.903},
    ("sz3", "normalized"): {1e-1: 4.808, 3e-2: 6.562, 1e-2: 8.174,
                            3e-3: 9.962, 1e-3: 11.665, 1e-4: 15.689},
    ("sz3", "rectified"): {1e-1: 3.072, 3e-2: 4.23, 1e-2: 5.389,
                           3e-3: 6.801, 1e-3: 8.145, 1e-4: 11.297},
    ("sz3", "normalized-rectified"): {1e-1: 4.118, 3e-2: 5.602, 1e-2: 7.004,
                                      3e-3: 8.576, 1e-3: 10.113, 1e-4: 13.684},
    ("sz3", "probability"): {1e-1: 0.097, 3e-2: 0.154, 1e-2: 0.318,
                             3e-3: 1.354, 1e-3: 2.482, 1e-4: 5.148},
    ("quantizer", "signed"): {1e-1: 4.369, 3e-2: 6.187, 1e-2: 7.686,
                              3e-3: 9.281, 1e-3: 11.086, 1e-4: 14.27},
    ("quantizer", "normalized"): {1e-1: 5.904, 3e-2: 7.884, 1e-2: 8.925,
                                  3e-3: 10.898, 1e-3: 12.878, 1e-4: 15.891},
    ("quantizer", "rectified"): {1e-1: 3.724, 3e-2: 5.432, 1e-2: 6.642,
                                 3e-3: 8.404, 1e-3: 10.085, 1e-4: 13.333},
    ("quantizer", "normalized-rectified"): {1e-1: 4.982, 3e-2: 6.853, 1e-2: 8.011,
                                            3e-3: 9.982, 1e-3: 11.643, 1e-4: 14.982},
    ("quantizer", "probability"): {1e-1: 1.501, 3e-2: 2.751, 1e-2: 3.751,
                                   3e-3: 5.501, 1e-3: 6.751, 1e-4: 10.501},
}

# code width -> bytes read + written per element by all ops, and ops launched, for
# (compress, decompress) of an fp32 map; same benchmark. Clamped outside the measured widths.
TRAFFIC: dict[int, tuple[float, float]] = {6: (115.3, 50.75), 8: (130.0, 63.0),
                                           9: (174.4, 103.1), 11: (189.1, 115.4),
                                           13: (203.9, 127.6), 16: (226.0, 146.0)}
OPS: dict[int, tuple[float, float]] = {6: (43, 21), 8: (51, 27), 9: (60, 35), 11: (68, 41),
                                       13: (76, 47), 16: (88, 56)}

_BITS_PER_DECADE = math.log2(10)
_V100 = 900e9 * 0.88


def _bits(error_bound: float, relative: bool, lossless: bool, compressor: str = "quantizer",
          kind: str | None = None, measured: Mapping[str, Mapping[float, float]] | None = None
          ) -> float:
    if compressor not in COMPRESSORS:
        raise CompressionError(f"compressor must be one of {', '.join(COMPRESSORS)}, "
                               f"got {compressor!r}")
    kinds = [k for c, k in BY_KIND if c == compressor and k != "all"]
    if kind is not None and kind not in kinds:
        raise CompressionError(f"map kind must be one of {', '.join(kinds)}, got {kind!r}")
    if compressor == "quantizer" and kind is None or relative or lossless:
        if compressor != "quantizer" or kind is not None:
            raise CompressionError("ratios by map kind, and SZ3's, are measured at absolute "
                                   "bounds without the zlib stage only")
        table = MEASURED[(bool(relative), bool(lossless))]
    elif measured and (kind or "all") in measured:
        table = measured[kind or "all"]
    else:
        table = BY_KIND[(compressor, kind or "all")]
    bounds = np.log10(sorted(table))
    bits = np.array([table[b] for b in sorted(table)])
    x = math.log10(error_bound)
    if x < bounds[0]:
        return float(bits[0] + (bounds[0] - x) * _BITS_PER_DECADE)
    return float(np.interp(x, bounds, bits))


def expected_ratio(error_bound: float, dtype: str = "float32", *, relative: bool = False,
                   lossless: bool = False, compressor: str = "quantizer",
                   kind: str | None = None,
                   measured: Mapping[str, Mapping[float, float]] | None = None) -> float:
    """Compression ratio of saved feature maps at ``error_bound`` (see the module's notes).

    ``relative``: the bound is a fraction of each map's value range. ``lossless``: with the
    zlib stage (CPU only, so not what a GPU step would use); both for the quantizer's pooled
    figures only. ``compressor``: ``"quantizer"`` or ``"sz3"``; ``kind``: the maps' kind
    (``memflow.graph.mapkind.MAP_KINDS``; None: all maps pooled); ``measured``: bits per
    element by kind (``"all"``: pooled) and bound, measured with ``compressor`` on the
    model's own maps, used for the kinds it holds.
    """
    if not (error_bound > 0 and math.isfinite(error_bound)):
        return 1.0
    width = {"float16": 16, "bfloat16": 16, "float64": 64}.get(str(dtype).replace("torch.", ""),
                                                               32)
    bits = _bits(error_bound, relative, lossless, compressor, kind, measured)
    if bits > min(23, width - 1):  # the quantizer keeps such maps raw (see quantizer.py)
        return 1.0
    return width / bits


def _per_width(table: dict[int, tuple[float, float]], bits: float, decompress: bool) -> float:
    widths = sorted(table)
    return float(np.interp(bits, widths, [table[w][int(decompress)] for w in widths]))


def throughput(mem_bandwidth: float = _V100, *, bits: float | None = None,
               error_bound: float = DEFAULT_ERROR_BOUND, decompress: bool = False,
               itemsize: int = 4) -> float:
    """Original bytes per second that memflow's quantizer processes on a GPU whose achieved
    memory bandwidth is ``mem_bandwidth`` (peak · memory_efficiency), memory-bound.

    ``bits`` defaults to the expected width at ``error_bound``; ``itemsize`` is the map's
    element size (the traffic was measured on fp32 maps, so 16-bit maps move a little less
    than modelled). Launch overheads are separate: :func:`launches`.
    """
    b = _bits(error_bound, False, False) if bits is None else float(bits)
    return mem_bandwidth * itemsize / _per_width(TRAFFIC, b, decompress)


def launches(bits: float, *, decompress: bool = False) -> float:
    """Kernels one compress (or decompress) launches at code width ``bits``.

    >>> launches(6), launches(13, decompress=True)
    (43.0, 47.0)
    """
    return _per_width(OPS, bits, decompress)


THROUGHPUT = throughput()
"""Compress throughput (bytes/s) on a V100 at the default bound: the simulator's default."""
