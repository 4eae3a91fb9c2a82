"""What the simulator charges for the ``compress`` policy: the ratio a bound buys, and the speed.

**Ratio.** :func:`expected_ratio` interpolates bits per element measured by
``benchmarks/bench_compress.py`` (section "compress" of ``benchmarks/RESULTS.md``) on the
feature maps autograd saves in real CPU training forwards of zoo models (resnet50, vgg16 at
112 px; gpt2 and bert-base with 4 layers at 128 tokens; fp32; outliers and headers counted),
pooled over all their bytes. Between measured bounds it is linear in log(bound); tighter than
measured it adds log2(10) bits per decade (a uniform quantizer needs one more bit each time
the bound halves); looser, it stays at the loosest measured figure (conservative). The ratio
is ``dtype bits / bits``, at least 1 (the quantizer stores a map raw when it would not pay).

**Speed.** The quantizer is a chain of memory-bound elementwise torch ops, so on a GPU its time
is its memory traffic over the achieved bandwidth, plus a launch per op. The benchmark counts
that traffic with a dispatch mode — bytes read and written by every op, per element, as a line
in the code width ``bits`` — and :func:`throughput` divides. It is memflow's own unfused
implementation, so it is conservative: a fused kernel (cuSZ-style) reads the map once.
``THROUGHPUT`` is the figure for a V100 (900 GB/s at 0.88) at the default bound of 1e-2.

>>> round(expected_ratio(1e-2), 1), round(expected_ratio(1e-2, "float16"), 1)
(3.6, 1.8)
>>> expected_ratio(1e-9) == 1.0
True
>>> round(throughput(900e9, bits=8) / 1e9)
18
"""
from __future__ import annotations

import math
from typing import Iterable

import numpy as np

__all__ = ["expected_ratio", "throughput", "launches", "fit_traffic", "MEASURED", "TRAFFIC",
           "THROUGHPUT", "DEFAULT_ERROR_BOUND"]

DEFAULT_ERROR_BOUND = 1e-2

# error bound -> bits per element, pooled over all maps. From
# `python benchmarks/bench_compress.py` (RESULTS.md, section "compress").
MEASURED: dict[tuple[bool, bool], dict[float, float]] = {
    # (relative, lossless)
    (False, False): {1e-1: 5.5, 5e-2: 6.5, 2e-2: 7.8, 1e-2: 8.8, 5e-3: 9.8, 2e-3: 11.1,
                     1e-3: 12.1, 1e-4: 15.5},
    (False, True): {1e-1: 2.5, 5e-2: 3.2, 2e-2: 4.2, 1e-2: 5.0, 5e-3: 5.9, 2e-3: 7.2,
                    1e-3: 8.2, 1e-4: 11.5},
    (True, False): {1e-1: 3.5, 3e-2: 5.2, 1e-2: 6.8, 3e-3: 8.5, 1e-3: 10.1, 1e-4: 13.4},
    (True, True): {1e-1: 1.2, 3e-2: 2.2, 1e-2: 3.3, 3e-3: 4.8, 1e-3: 6.2, 1e-4: 9.5},
}

# bytes read + written per element = a + b·bits, and ops = c + d·bits (fp32 maps)
TRAFFIC = {"compress": (60.0, 2.5), "decompress": (30.0, 2.5)}
OPS = {"compress": (30.0, 5.0), "decompress": (12.0, 7.0)}

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
    return max(1.0, width / min(width, _bits(error_bound, relative, lossless)))


def _line(coefficients: tuple[float, float], bits: float) -> float:
    return coefficients[0] + coefficients[1] * bits


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
    per_element = _line(TRAFFIC["decompress" if decompress else "compress"], b)
    return mem_bandwidth * itemsize / per_element


def launches(bits: float, *, decompress: bool = False) -> float:
    """Kernels one compress (or decompress) launches at code width ``bits``.

    >>> launches(8) > launches(2)
    True
    """
    return _line(OPS["decompress" if decompress else "compress"], bits)


def fit_traffic(bits: Iterable[float], traffic: Iterable[float],
                ops: Iterable[float]) -> dict[str, tuple[float, float]]:
    """Least-squares lines ``traffic = a + b·bits`` and ``ops = c + d·bits`` (the benchmark's
    measurements, for :data:`TRAFFIC` and :data:`OPS`).

    >>> fit_traffic([1, 2, 3], [12, 14, 16], [5, 6, 7])
    {'traffic': (10.0, 2.0), 'ops': (4.0, 1.0)}
    """
    x = np.asarray(list(bits), float)
    out = {}
    for key, y in (("traffic", traffic), ("ops", ops)):
        slope, intercept = np.polyfit(x, np.asarray(list(y), float), 1)
        out[key] = (round(float(intercept), 2), round(float(slope), 2))
    return out


THROUGHPUT = throughput()
"""Compress throughput (bytes/s) on a V100 at the default bound: the simulator's default."""
