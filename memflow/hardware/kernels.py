"""The shape-class rate table: a CPU's matrix-product and convolution rates by kernel shape.

A CPU kernel's achieved FLOP/s depends on its shape, not only on its kind: on one thread a
512x512x512 matrix product runs several times faster than an 8x16x16 one, and a 1x1
convolution on 2x2 maps (PyTorch runs it per sample) far slower than the same FLOPs on 16x16
maps. The graph records every matrix product's and convolution's shape (units column
``kernels``: class, ``m``, ``n``, ``k``, count; :func:`memflow.graph.opcost.kernel_shape`), and
the micro-benchmark times a small grid of shape classes per kernel class (:data:`GRID`), each
forward and backward (the backward's aten kernels, without autograd; twice the forward's
FLOPs). A table row is ``[class, m, n, k, forward FLOP/s, backward FLOP/s]``.

:func:`class_rates` gives a kernel the rate of the nearest class of its kernel class,
interpolated in log-size: the classes' log rates weighted by inverse distance to the fourth
power in ``(log m, log n, log k)`` (Shepard), so the nearest class dominates, a kernel on a
grid point gets that point's rate exactly, and the rate moves continuously between points.

>>> table = [["matmul", 16, 16, 16, 2e9, 1e9], ["matmul", 256, 256, 256, 8e9, 6e9]]
>>> fwd, bwd = class_rates(table, ["matmul", "matmul"], [16, 64], [16, 64], [16, 64])
>>> (fwd / 1e9).round(2).tolist(), (bwd / 1e9).round(2).tolist()
([2.0, 4.0], [1.0, 2.45])
"""
from __future__ import annotations

import itertools
import math
from typing import Any, Callable, Sequence

import numpy as np

__all__ = ["GRID", "OPERAND_SETS", "cycling", "matmul_kernel", "conv_kernel", "grid_kernel",
           "measure_grid", "class_rates"]

GRID: dict[str, tuple[tuple[str, int, int, int], ...]] = {
    # matrix products: rows (a batch's samples or tokens) few or many, features narrow or wide
    "default": (("matmul", 32, 64, 64), ("matmul", 32, 512, 512), ("matmul", 512, 64, 64),
                ("matmul", 512, 512, 512),
                # 3x3 convolutions (batch 8): 4x4 or 16x16 maps, 16 or 128 channels
                ("conv", 128, 16, 144), ("conv", 128, 128, 1152), ("conv", 2048, 16, 144),
                ("conv", 2048, 128, 1152),
                # 1x1 convolutions (batch 8): 2x2 or 16x16 maps, 32 or 256 channels
                ("conv1x1", 32, 32, 32), ("conv1x1", 32, 256, 256), ("conv1x1", 2048, 32, 32),
                ("conv1x1", 2048, 256, 256)),
    "tiny": (("matmul", 8, 8, 8), ("matmul", 16, 16, 16), ("conv", 16, 4, 36),
             ("conv1x1", 16, 8, 8)),
}
"""Shape classes ``(class, m, n, k)`` the micro-benchmark times, per micro-benchmark size: a
convolution's ``m`` is batch x map positions (batch 8, 1 for ``tiny``), ``n`` its output
channels, ``k`` its input channels x kernel positions (square maps, as many channels in as
out)."""
_BATCH = {"default": 8, "tiny": 1}

OPERAND_SETS = 8
"""Operand sets a kernel benchmark cycles through: in a model each layer reads its own
weights and maps, which a kernel called again and again on the same operands finds in cache
(faster than a model's layers run: resnet50's small convolutions ran at ~15 GFLOP/s in a
step against ~40 for one 3x3 kernel repeated)."""

Kernel = tuple[float, Callable[[], Any], Callable[[], Any]]
"""FLOPs of one forward call, the forward call, the backward call (twice the FLOPs)."""


def cycling(make: Callable[[], tuple], fn: Callable[..., Any]) -> Callable[[], Any]:
    """``fn`` called on :data:`OPERAND_SETS` operand sets (each from ``make()``) in turn."""
    sets = itertools.cycle([make() for _ in range(OPERAND_SETS)])
    return lambda: fn(*next(sets))


def matmul_kernel(m: int, n: int, k: int) -> Kernel:
    """An ``m x k`` by ``k x n`` fp32 product; its backward is the two products autograd runs
    (input and weight gradients)."""
    import torch

    def make() -> tuple:
        return torch.randn(m, k), torch.randn(k, n), torch.randn(m, n)
    return (2.0 * m * n * k, cycling(make, lambda a, b, g: torch.mm(a, b)),
            cycling(make, lambda a, b, g: (torch.mm(g, b.t()), torch.mm(a.t(), g))))


def conv_kernel(batch: int, channels: int, side: int, kernel: int) -> Kernel:
    """A ``kernel`` x ``kernel`` fp32 convolution of ``channels`` to ``channels`` on
    ``side`` x ``side`` maps (same padding); its backward is ``convolution_backward`` for
    input and weight."""
    import torch

    back, pad = torch.ops.aten.convolution_backward, kernel // 2

    def make() -> tuple:
        return (torch.randn(batch, channels, side, side),
                torch.randn(channels, channels, kernel, kernel),
                torch.randn(batch, channels, side, side))
    return (2.0 * batch * channels * channels * kernel * kernel * side * side,
            cycling(make, lambda x, w, g: torch.nn.functional.conv2d(x, w, padding=pad)),
            cycling(make, lambda x, w, g: back(g, x, w, None, [1, 1], [pad, pad], [1, 1],
                                                False, [0, 0], 1, [True, True, False])))


def grid_kernel(shape: tuple[str, int, int, int], batch: int) -> Kernel:
    """The kernel of one shape class of :data:`GRID` (a convolution of ``batch`` samples)."""
    cls, m, n, k = shape
    if cls == "matmul":
        return matmul_kernel(m, n, k)
    kernel = 1 if cls == "conv1x1" else 3
    return conv_kernel(batch, n, math.isqrt(m // batch), kernel)


def measure_grid(size: str, seconds: Callable[[Callable[[], Any]], tuple[float, float]]
                 ) -> dict[str, list[list]]:
    """The rate table of :data:`GRID` ``[size]``, by wall clock (``one``) and by CPU time
    (``cpu``): ``seconds(call)`` times one call, ``(wall, cpu)`` (the micro-benchmark's mean
    over a window; a fixed fake in tests).

    >>> t = measure_grid("tiny", lambda call: (1e-3, 2e-3))
    >>> t["one"][0], t["cpu"][0]
    (['matmul', 8, 8, 8, 1024000.0, 2048000.0], ['matmul', 8, 8, 8, 512000.0, 1024000.0])
    """
    import torch

    out: dict[str, list[list]] = {"one": [], "cpu": []}
    with torch.no_grad():
        for shape in GRID[size]:
            flops, fwd, bwd = grid_kernel(shape, _BATCH[size])
            f, b = seconds(fwd), seconds(bwd)
            for i, clock in enumerate(("one", "cpu")):
                out[clock].append([*shape, flops / f[i], 2 * flops / b[i]])
    return out


def class_rates(table: Sequence[Sequence], classes: Sequence[str], m, n, k,
                power: float = 4.0) -> tuple[np.ndarray, np.ndarray]:
    """Forward and backward FLOP/s of kernels of ``classes`` and sizes ``m``, ``n``, ``k``
    from the rows of ``table`` (see the module doc); NaN where ``table`` has no row of a
    kernel's class."""
    rows = list(table)
    classes = np.asarray(classes, dtype=object)
    at = np.log(np.maximum(np.stack([np.asarray(x, float) for x in (m, n, k)], 1), 1.0))
    fwd, bwd = np.full(len(classes), np.nan), np.full(len(classes), np.nan)
    for cls in set(classes.tolist()):
        mine = [r for r in rows if r[0] == cls]
        pick = classes == cls
        if not mine:
            continue
        grid = np.log(np.array([r[1:4] for r in mine], float))
        rates = np.array([r[4:6] for r in mine], float)
        dist = np.linalg.norm(at[pick][:, None, :] - grid[None, :, :], axis=2)
        w = 1.0 / np.maximum(dist, 1e-12) ** power
        blended = np.exp(w @ np.log(rates) / w.sum(1, keepdims=True))
        exact = dist < 1e-12                        # on a grid point: its rates, bit for bit
        hit = exact.any(1)
        blended[hit] = rates[exact[hit].argmax(1)]
        fwd[pick], bwd[pick] = blended[:, 0], blended[:, 1]
    return fwd, bwd
