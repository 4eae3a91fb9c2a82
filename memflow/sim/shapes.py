"""What a CPU's shape-class rates (:mod:`memflow.hardware.kernels`) make of each unit's kernels.

A unit's matrix products and convolutions (units column ``kernels``) are charged at the
forward and backward rates of their shape classes: per unit, the flop-weighted harmonic mean
of its kernels' rates (:func:`shaped_rates`). :func:`memflow.sim.cpu_time.cpu_compute` charges
that share of the unit's expensive FLOPs at those rates, and the rest (fused attention, a
kernel of a class the table lacks, a graph saved before the column) as before, by FLOPs per
op between the small and the large kernels' rates.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..hardware.kernels import class_rates

__all__ = ["UnitKernels", "unit_kernels", "shaped_rates"]


class UnitKernels(NamedTuple):
    """Every unit's kernels, flat: unit position, class, ``m``, ``n``, ``k``, count."""

    unit: np.ndarray
    cls: np.ndarray
    m: np.ndarray
    n: np.ndarray
    k: np.ndarray
    count: np.ndarray


def unit_kernels(graph) -> UnitKernels:
    """The kernels of ``graph``'s units (its ``kernels`` column), as flat arrays.

    >>> import memflow
    >>> g = memflow.zoo.graph("mlp", batch_size=4, width=8)
    >>> unit_kernels(g).m.tolist()
    [4.0, 4.0, 4.0, 4.0]
    """
    rows = [(u, *r) for u, cell in enumerate(graph.units["kernels"]) for r in cell]
    cols = list(zip(*rows)) if rows else [()] * 6
    return UnitKernels(np.asarray(cols[0], np.int64), np.asarray(cols[1], object),
                       *(np.asarray(c, np.float64) for c in cols[2:]))


def shaped_rates(kernels: UnitKernels, table, deg: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per unit: the FLOPs of its kernels whose class ``table`` has, per replica of ``deg``
    replicas (a split divides a kernel's rows ``m``; a batched product's count instead), and
    their forward and backward FLOP/s (flop-weighted harmonic means; 1 where it has none).

    >>> from memflow.hardware.local import EXAMPLE_FIGURES
    >>> k = UnitKernels(np.array([0, 0]), np.array(["matmul", "matmul"], object),
    ...                 np.array([32.0, 512]), np.array([64.0, 512]), np.array([64.0, 512]),
    ...                 np.array([1.0, 1]))
    >>> flops, fwd, bwd = shaped_rates(k, EXAMPLE_FIGURES["kernel_rates"]["one"], np.ones(1))
    >>> float(flops[0]), round(float(fwd[0]) / 1e9, 2)
    (268697600.0, 31.91)
    """
    n = len(deg)
    d = deg[kernels.unit]
    batched = (kernels.cls == "matmul") & (kernels.count > 1)
    m = np.where(batched, kernels.m, kernels.m / d)
    fwd, bwd = class_rates(table, kernels.cls, m, kernels.n, kernels.k)
    known = ~np.isnan(fwd)
    flops = np.where(known, 2.0 * kernels.m * kernels.n * kernels.k * kernels.count / d, 0.0)
    per_unit = np.bincount(kernels.unit, weights=flops, minlength=n)
    seconds = [np.bincount(kernels.unit, weights=np.divide(flops, r, out=np.zeros_like(flops),
                                                           where=known), minlength=n)
               for r in (fwd, bwd)]
    rates = [np.divide(per_unit, s, out=np.ones(n), where=s > 0) for s in seconds]
    return per_unit, rates[0], rates[1]
