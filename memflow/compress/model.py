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

These are the quantizer's ratios because the quantizer is what an exported step runs on a GPU;
SZ3 (pysz, :mod:`~memflow.compress.sz3`), memflow's compressor on the CPU, packs the same maps
tighter (1.35x to 1.45x fewer bits at absolute bounds 0.1 to 1e-3 in that section, ``sz3_*``).

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
>>> expected_ratio(1e-9) == 1.0
True
>>> round(throughput(900e9, bits=8) / 1e9)
28
"""
from __future__ import annotations

import math
import numpy as np

__all__ = ["expected_ratio", "throughput", "launches", "MEASURED", "TRAFFIC", "OPS",
           "THROUGHPUT", "DEFAULT_ERROR_BOUND"]

DEFAULT_ERROR_BOUND = 1e-2

# error bound -> bits per element, pooled over all maps, keyed by (relative, lossless). From
# `python benchmarks/bench_compress.py` (RESULTS.md, section "compress"), 2026-11-22.
MEASURED: dict[tuple[bool, bool], dict[float, float]] = {
    (False, False): {1e-1: 4.234, 3e-2: 5.995, 1e-2: 7.369, 3e-3: 9.069, 1e-3: 10.806,
                     1e-4: 14.037},
    (False, True): {1e-1: 2.89, 3e-2: 4.19, 1e-2: 5.328, 3e-3: 6.753, 1e-3: 8.056,
                    1e-4: 10.873},
    (True, False): {1e-1: 3.007, 1e-2: 6.007, 1e-3: 9.007, 1e-4: 13.007},
    (True, True): {1e-1: 1.528, 1e-2: 4.087, 1e-3: 6.867, 1e-4: 9.515},
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


def _bits(error_bound: float, relative: bool, lossless: bool) -> float:
    table = MEASURED[(bool(relative), bool(lossless))]
    bounds = np.log10(sorted(table))
    bits = np.array([table[b] for b in sorted(table)])
    x = math.log10(error_bound)
    if x < bounds[0]:
        return float(bits[0] + (bounds[0] - x) * _BITS_PER_DECADE)
    return float(np.interp(x, bounds, bits))


def expected_ratio(error_bound: float, dtype: str = "float32", *, relative: bool = False,
                   lossless: bool = False) -> float:
    """Compression ratio of saved feature maps at ``error_bound`` (see the module's notes).

    ``relative``: the bound is a fraction of each map's value range. ``lossless``: with the
    zlib stage (CPU only, so not what a GPU step would use).
    """
    if not (error_bound > 0 and math.isfinite(error_bound)):
        return 1.0
    width = {"float16": 16, "bfloat16": 16, "float64": 64}.get(str(dtype).replace("torch.", ""),
                                                               32)
    bits = _bits(error_bound, relative, lossless)
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
