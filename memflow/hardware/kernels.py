"""The shape-class rate table: a CPU's matrix-product and convolution rates by kernel shape.

A CPU kernel's achieved FLOP/s depends on its shape, not only on its kind: on one thread a
512x512x512 matrix product runs several times faster than an 8x16x16 one, and a 1x1
convolution on 2x2 maps (PyTorch runs it per sample) far slower than the same FLOPs on 16x16
maps. The graph records every matrix product's and convolution's shape (units column
``kernels``: class, ``m``, ``n``, ``k``, count; :func:`memflow.graph.opcost.kernel_shape`), and
the micro-benchmark times a small grid of shape classes per kernel class (:data:`GRID`), each
forward and backward (the backward's aten kernels, without autograd; twice the forward's
FLOPs). A table row is ``[class, m, n, k, forward FLOP/s, backward FLOP/s]``.

Two things a kernel meets inside a training step are part of its class's timing, both measured:

* the ``matmul`` class is timed as ``nn.Linear`` runs it (every two-dimensional matrix product
  of the zoo's models is one): ``addmm`` with the bias and a transposed weight forward (10-17%
  slower than a plain ``mm`` of the same shape on this project's CPU), and the two products and
  the bias's sum autograd runs for it backward (:func:`linear_kernel`);
* each call follows an :func:`evictor`, a copy through as many bytes as the core's L2 cache
  holds, as a step's other ops stream their maps through it between two kernels: the kernel
  reloads its operands from the next level, as in a step, and the copy's own time, timed
  alone, is taken off (resnet50's, mlp's and gpt2's kernels ran 1.24-1.29x slower forward in a
  step than called back to back on cached operands).

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

__all__ = ["GRID", "OPERAND_SETS", "cycling", "matmul_kernel", "linear_kernel", "conv_kernel",
           "grid_kernel", "cache_bytes", "evictor", "measure_grid", "class_rates", "fit_table"]

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


def linear_kernel(m: int, n: int, k: int) -> Kernel:
    """An ``nn.Linear`` of ``k`` to ``n`` features on ``m`` rows (fp32): forward
    ``F.linear`` (``addmm`` of the bias and the input by the transposed ``n x k`` weight);
    backward the kernels autograd runs for it (input gradient ``g @ W``, weight gradient
    ``g.t() @ x``, bias gradient ``g.sum(0)``)."""
    import torch

    linear = torch.nn.functional.linear

    def make() -> tuple:
        return torch.randn(m, k), torch.randn(n, k), torch.randn(n), torch.randn(m, n)
    return (2.0 * m * n * k, cycling(make, lambda x, w, b, g: linear(x, w, b)),
            cycling(make, lambda x, w, b, g: (torch.mm(g, w), torch.mm(g.t(), x), g.sum(0))))


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
        return linear_kernel(m, n, k)
    kernel = 1 if cls == "conv1x1" else 3
    return conv_kernel(batch, n, math.isqrt(m // batch), kernel)


def cache_bytes(level: int = 2, default: int = 2**20) -> int:
    """Bytes of this machine's level-``level`` data cache (Linux sysfs; ``default`` where it
    does not say)."""
    from pathlib import Path

    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            if (int((index / "level").read_text()) == level
                    and (index / "type").read_text().strip() in ("Data", "Unified")):
                text = (index / "size").read_text().strip()
                return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)
        except (OSError, ValueError):
            continue
    return default


def evictor(nbytes: int | None = None) -> Callable[[], Any]:
    """A call that streams ``nbytes`` (default: the L2 cache's, :func:`cache_bytes`) through
    the cache: a copy of ``nbytes`` into another ``nbytes``, as a step's other ops do between
    two kernels."""
    import torch

    src = torch.ones((nbytes or cache_bytes()) // 4)
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def _after(first: Callable[[], Any], call: Callable[[], Any]) -> Callable[[], Any]:
    return lambda: (first(), call())[1]


def measure_grid(size: str, seconds: Callable[[Callable[[], Any]], tuple[float, float]],
                 evict: Callable[[], Any] | None = None) -> dict[str, list[list]]:
    """The rate table of :data:`GRID` ``[size]``, by wall clock (``one``) and by CPU time
    (``cpu``): ``seconds(call)`` times one call, ``(wall, cpu)`` (the micro-benchmark's mean
    over a window; a fake in tests). With ``evict`` (:func:`evictor`) every call follows it,
    and its own seconds, timed alone, are taken off (floored at a picosecond: a fake or a
    loaded machine can time the pair no slower).

    >>> t = measure_grid("tiny", lambda call: (1e-3, 2e-3))
    >>> t["one"][0], t["cpu"][0]
    (['matmul', 8, 8, 8, 1024000.0, 2048000.0], ['matmul', 8, 8, 8, 512000.0, 1024000.0])
    """
    import torch

    out: dict[str, list[list]] = {"one": [], "cpu": []}
    with torch.no_grad():
        base = seconds(evict) if evict is not None else (0.0, 0.0)

        def timed(call: Callable[[], Any]) -> tuple[float, ...]:
            pair = seconds(call if evict is None else _after(evict, call))
            return tuple(max(t - b, 1e-12) for t, b in zip(pair, base))
        for shape in GRID[size]:
            flops, fwd, bwd = grid_kernel(shape, _BATCH[size])
            f, b = timed(fwd), timed(bwd)
            for i, clock in enumerate(("one", "cpu")):
                out[clock].append([*shape, flops / f[i], 2 * flops / b[i]])
    return out


def _shepard(rows: Sequence[Sequence], at: np.ndarray, power: float
             ) -> tuple[np.ndarray, np.ndarray]:
    """Inverse-distance weights (kernels x ``rows``, unnormalised) of kernels at log-sizes
    ``at`` and the kernels that sit on a row (their weight is that row's alone)."""
    grid = np.log(np.array([r[1:4] for r in rows], float))
    dist = np.linalg.norm(at[:, None, :] - grid[None, :, :], axis=2)
    return 1.0 / np.maximum(dist, 1e-12) ** power, dist < 1e-12


def _log_sizes(m, n, k) -> np.ndarray:
    return np.log(np.maximum(np.stack([np.asarray(x, float) for x in (m, n, k)], 1), 1.0))


def class_rates(table: Sequence[Sequence], classes: Sequence[str], m, n, k,
                power: float = 4.0) -> tuple[np.ndarray, np.ndarray]:
    """Forward and backward FLOP/s of kernels of ``classes`` and sizes ``m``, ``n``, ``k``
    from the rows of ``table`` (see the module doc); NaN where ``table`` has no row of a
    kernel's class."""
    rows = list(table)
    classes = np.asarray(classes, dtype=object)
    at = _log_sizes(m, n, k)
    fwd, bwd = np.full(len(classes), np.nan), np.full(len(classes), np.nan)
    for cls in set(classes.tolist()):
        mine = [r for r in rows if r[0] == cls]
        pick = classes == cls
        if not mine:
            continue
        rates = np.array([r[4:6] for r in mine], float)
        w, exact = _shepard(mine, at[pick], power)
        blended = np.exp(w @ np.log(rates) / w.sum(1, keepdims=True))
        hit = exact.any(1)                          # on a grid point: its rates, bit for bit
        blended[hit] = rates[exact[hit].argmax(1)]
        fwd[pick], bwd[pick] = blended[:, 0], blended[:, 1]
    return fwd, bwd


def fit_table(table: Sequence[Sequence], classes: Sequence[str], m, n, k, count, backward,
              seconds, power: float = 4.0, ridge: float = 1e-3) -> list[list]:
    """The rows of ``table`` with the rates that best explain measured kernel times: kernels
    of ``classes``, sizes ``m``, ``n``, ``k``, ``count`` products each, ``backward`` (bool:
    a backward's time, twice the forward's FLOPs) and ``seconds``.

    :func:`class_rates` is linear in the rows' log rates, so the fit is a weighted linear least
    squares in log rate, per class and phase: each kernel's log of measured over predicted
    rate, weighted by its share of the measured seconds (what a step's time is made of), and a
    ``ridge`` (relative to each row's own weight) that keeps a row near the micro-benchmark's
    rate where the kernels that reach it disagree. Rows of a class or a
    phase without a measured kernel are kept as they are.

    >>> table = [["matmul", 16, 16, 16, 2e9, 1e9], ["matmul", 256, 256, 256, 8e9, 6e9]]
    >>> fitted = fit_table(table, ["matmul"], [16], [16], [16], [1], [False], [2 * 16**3 / 1e9])
    >>> [round(r[4] / 1e9, 3) for r in fitted], [r[5] / 1e9 for r in fitted]
    ([1.0, 8.0], [1.0, 6.0])
    """
    rows = [list(r) for r in table]
    classes = np.asarray(classes, dtype=object)
    backward = np.asarray(backward, bool)
    seconds = np.asarray(seconds, float)
    flops = 2.0 * np.prod([np.asarray(x, float) for x in (m, n, k, count)], axis=0)
    flops = np.where(backward, 2 * flops, flops)
    at = _log_sizes(m, n, k)
    for cls in set(classes.tolist()):
        mine = [i for i, r in enumerate(rows) if r[0] == cls]
        for col, phase in ((4, False), (5, True)):
            pick = (classes == cls) & (backward == phase) & (seconds > 0)
            if not mine or not pick.any():
                continue
            w, exact = _shepard([rows[i] for i in mine], at[pick], power)
            hit = exact.any(1)
            w[hit] = exact[hit]                      # on a grid point: that row's alone
            w /= w.sum(1, keepdims=True)
            start = np.log([rows[i][col] for i in mine])
            y = np.log(flops[pick] / seconds[pick]) - w @ start
            share = np.sqrt(seconds[pick] / seconds[pick].sum())     # of this fit's seconds
            reached = w.sum(0) > 0                   # rows no kernel weighs keep their bits
            w = w[:, reached]
            a = w * share[:, None]
            # the ridge of a row is relative to its own data: one measured row is fitted
            a = np.vstack([a, np.diag(np.sqrt(ridge * (a ** 2).sum(0)))])
            b = np.concatenate([y * share, np.zeros(w.shape[1])])
            step = np.linalg.lstsq(a, b, rcond=None)[0]
            for i, s in zip(np.asarray(mine)[reached].tolist(), step):
                rows[i][col] = float(rows[i][col] * np.exp(s))
    return rows
