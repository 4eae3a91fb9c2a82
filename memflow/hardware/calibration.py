"""Calibration: the time model's efficiencies fitted to measured op times.

The time model charges a piece of work ``max(flops / (peak_flops · compute_efficiency),
bytes_moved / (mem_bandwidth · memory_efficiency)) + ops · launch_overhead``
(``docs/data-model.md``, "Time model"). Its efficiencies come from the efficiency table
(:mod:`memflow.hardware.efficiency`, datasheets and papers); :func:`calibrate` replaces them
with the values that best explain measured times instead — a DataFrame with one row per timed
op (or unit, or any piece of work), columns (``docs/data-model.md``, "Measured op times"):

* ``flops``, ``bytes_moved``, ``ops`` — what the work does (as the graph's units count it);
* ``seconds`` — how long it took (a median of repetitions);
* ``dtype`` (optional) — ``float32`` (default), ``float16`` or ``bfloat16``: which peak applies.

The fit minimises relative errors (a 10 µs op counts as much as a 10 ms one). A fitted rate
above the datasheet peak raises the peak (the efficiency stays at most 1). The calibrated
devices' ``figures`` column says ``calibrated``.

A CPU measured here (``Cluster.local()``) charges matrix products and convolutions at its
shape-class rate table (:mod:`memflow.hardware.kernels`) instead: measured times of kernels
— columns ``class`` (``matmul``, ``conv``, ``conv1x1``), ``m``, ``n``, ``k``, ``seconds``, and
optionally ``count`` (products per call, default 1) and ``phase`` (``forward``, the default, or
``backward``: the kernels autograd runs for one forward kernel) — refit that table
(:func:`calibrate_kernels`; :func:`calibrate` does it for a DataFrame with a ``class`` column).

>>> import pandas as pd
>>> from memflow.hardware import Cluster
>>> c = Cluster.preset("1xV100-16GB")
>>> ops = pd.DataFrame({"flops": [2e12, 1e9, 0.0], "bytes_moved": [1e9, 8e9, 1e3],
...                     "ops": [1, 1, 50]})
>>> ops["seconds"] = predicted_seconds(ops, 15.7e12 * 0.5, 900e9 * 0.8, 8e-6)
>>> fitted = calibrate(ops, c).devices.loc["gpu0"]
>>> [round(float(fitted[k]), 3) for k in ("compute_efficiency", "memory_efficiency")]
[0.5, 0.8]
>>> fitted["figures"]
'calibrated'
"""
from __future__ import annotations

from typing import Iterable

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from ..errors import ClusterError
from .cluster import Cluster
from .kernels import GRID, fit_table

__all__ = ["calibrate", "calibrate_kernels", "fit_rates", "predicted_seconds",
           "MEASURED_COLUMNS", "KERNEL_COLUMNS"]

MEASURED_COLUMNS = ("flops", "bytes_moved", "ops", "seconds")
"""Required columns of a measured-times DataFrame (``dtype`` is optional)."""
KERNEL_COLUMNS = ("class", "m", "n", "k", "seconds")
"""Required columns of measured kernel times (``count`` and ``phase`` are optional)."""
_CLASSES = sorted({shape[0] for grid in GRID.values() for shape in grid})


def predicted_seconds(work: pd.DataFrame, flop_rate, byte_rate, launch) -> np.ndarray:
    """The time model's seconds for each row of ``work`` at achieved rates ``flop_rate``
    (FLOP/s) and ``byte_rate`` (bytes/s) and ``launch`` seconds per op (scalars or arrays)."""
    return (np.maximum(work["flops"].to_numpy(float) / flop_rate,
                       work["bytes_moved"].to_numpy(float) / byte_rate)
            + work["ops"].to_numpy(float) * launch)


def _checked(measured: pd.DataFrame) -> pd.DataFrame:
    if not isinstance(measured, pd.DataFrame):
        raise ClusterError(f"measured op times must be a DataFrame, got {type(measured).__name__}")
    missing = [c for c in MEASURED_COLUMNS if c not in measured.columns]
    if missing:
        raise ClusterError(f"measured op times lack the columns {missing}; they need "
                           f"{list(MEASURED_COLUMNS)} (and optionally 'dtype')")
    out = measured.copy()
    for col in MEASURED_COLUMNS:
        out[col] = pd.to_numeric(out[col], errors="coerce")
        bad = out[col].isna() | (out[col] < 0)
        if bad.any():
            raise ClusterError(f"measured op times, row {out.index[bad.to_numpy()][0]!r}: "
                               f"{col} must be a number >= 0")
    if not (out["seconds"] > 0).any():
        raise ClusterError("measured op times: no row has seconds > 0; nothing to fit")
    return out[out["seconds"] > 0]


def fit_rates(measured: pd.DataFrame, flop_rate: float, byte_rate: float,
              launch: float) -> dict[str, float]:
    """Achieved ``flop_rate``, ``byte_rate`` and ``launch`` (seconds per op) that best explain
    ``measured`` (columns :data:`MEASURED_COLUMNS`), starting from the given ones; also the
    fit's ``median_error`` (median of ``|predicted / measured - 1|``) and ``rows``.

    A figure the rows cannot tell (no row bound by it) keeps its starting value.

    >>> w = pd.DataFrame({"flops": [1e9, 0.0, 0.0], "bytes_moved": [0.0, 1e9, 0.0],
    ...                   "ops": [1, 1, 100]})
    >>> w["seconds"] = predicted_seconds(w, 2e10, 5e9, 1e-5)
    >>> {k: float(f"{v:.4g}") for k, v in fit_rates(w, 1e10, 1e10, 5e-6).items()}
    {'flop_rate': 20000000000.0, 'byte_rate': 5000000000.0, 'launch': 1e-05,
     'median_error': 0.0, 'rows': 3.0}
    """
    work = _checked(measured)
    seconds = work["seconds"].to_numpy(float)
    # unknowns are the seconds per FLOP, per byte and per op, scaled to about 1
    start = np.array([1.0 / flop_rate, 1.0 / byte_rate, launch])

    def residual(x: np.ndarray) -> np.ndarray:
        s = x * start
        return predicted_seconds(work, 1.0 / max(s[0], 1e-300), 1.0 / max(s[1], 1e-300),
                                 s[2]) / seconds - 1.0

    fit = least_squares(residual, np.ones(3), bounds=(1e-9, np.inf), xtol=1e-12, ftol=1e-12,
                        gtol=1e-12)
    per = fit.x * start
    out = {"flop_rate": 1.0 / per[0], "byte_rate": 1.0 / per[1], "launch": float(per[2]),
           "median_error": float(np.median(np.abs(residual(fit.x)))), "rows": int(len(work))}
    # a figure no row depends on stays where it started (the gradient is zero there)
    f = work["flops"].to_numpy(float) * per[0]
    b = work["bytes_moved"].to_numpy(float) * per[1]
    if not (work["flops"].to_numpy(float) > 0).any() or not (f >= b).any():
        out["flop_rate"] = flop_rate
    if not (work["bytes_moved"].to_numpy(float) > 0).any() or not (b >= f).any():
        out["byte_rate"] = byte_rate
    return out


def _devices(cluster: Cluster, devices: Iterable[str] | None) -> list[str]:
    names = list(cluster.devices.index if devices is None else devices)
    unknown = [d for d in names if d not in cluster.devices.index]
    if unknown:
        raise ClusterError(f"calibrate: unknown device {unknown[0]!r}; devices are "
                           f"{list(cluster.devices.index[:8])}")
    return names


def _kernel_rows(measured: pd.DataFrame) -> pd.DataFrame:
    if not isinstance(measured, pd.DataFrame):
        raise ClusterError(f"measured kernel times must be a DataFrame, got "
                           f"{type(measured).__name__}")
    missing = [c for c in KERNEL_COLUMNS if c not in measured.columns]
    if missing:
        raise ClusterError(f"measured kernel times lack the columns {missing}; they need "
                           f"{list(KERNEL_COLUMNS)} (and optionally 'count', 'phase')")
    out = measured.assign(count=measured["count"] if "count" in measured else 1,
                          phase=measured["phase"] if "phase" in measured else "forward")
    for col in ("m", "n", "k", "count", "seconds"):
        out[col] = pd.to_numeric(out[col], errors="coerce")
        bad = out[col].isna() | (out[col] <= 0)
        if bad.any():
            raise ClusterError(f"measured kernel times, row {out.index[bad.to_numpy()][0]!r}: "
                               f"{col} must be a number > 0")
    for col, valid in (("class", _CLASSES), ("phase", ["backward", "forward"])):
        bad = ~out[col].isin(valid)
        if bad.any():
            raise ClusterError(f"measured kernel times, row {out.index[bad.to_numpy()][0]!r}: "
                               f"{col} {out[col][bad].iloc[0]!r} is not one of {valid}")
    return out


def calibrate_kernels(measured: pd.DataFrame, cluster: Cluster,
                      devices: Iterable[str] | None = None) -> Cluster:
    """``cluster`` with the shape-class rate table of ``devices`` (default: all; CPUs measured
    here, each with its ``kernel_rates``) refitted to measured kernel times (columns
    :data:`KERNEL_COLUMNS`, see the module doc; :func:`~memflow.hardware.kernels.fit_table`).

    >>> from memflow.hardware.local import EXAMPLE_FIGURES, local_cluster
    >>> c = local_cluster(EXAMPLE_FIGURES, 1, threads=1)
    >>> slow = pd.DataFrame({"class": ["matmul"], "m": [32], "n": [64], "k": [64],
    ...                      "seconds": [2 * 32 * 64 * 64 / 4e9]})
    >>> fitted = calibrate_kernels(slow, c).devices.loc["cpu0"]
    >>> import json; [round(r[4] / 1e9, 2) for r in json.loads(fitted["kernel_rates"])][:2]
    [4.0, 32.0]
    >>> fitted["figures"]
    'calibrated'
    """
    import json

    names = _devices(cluster, devices)
    work = _kernel_rows(measured)
    cells = (cluster.devices.loc[names, "kernel_rates"] if "kernel_rates"
             in cluster.devices.columns else pd.Series(np.nan, index=names))
    lacking = [d for d, cell in cells.items() if not isinstance(cell, str)]
    if lacking:
        raise ClusterError(f"calibrate: device {lacking[0]!r} has no shape-class rate table "
                           "(kernel_rates): only a CPU measured here (Cluster.local()) has one")
    fitted = {d: json.dumps(fit_table(json.loads(cell), work["class"], work["m"], work["n"],
                                      work["k"], work["count"], work["phase"].eq("backward"),
                                      work["seconds"]))
              for d, cell in cells.items()}
    return cluster.replace(devices=names, name=f"{cluster.name} (calibrated)",
                           figures="calibrated", kernel_rates=fitted)


def calibrate(measured: pd.DataFrame, cluster: Cluster,
              devices: Iterable[str] | None = None) -> Cluster:
    """``cluster`` with the efficiencies of ``devices`` (default: all; they must share one
    model) fitted to ``measured`` (see the module doc). Rows with ``dtype`` float16, and
    bfloat16 on devices with bf16 units, calibrate against the 16-bit peak, the others against
    FP32; one fit serves both, so mixed
    rows agree on one compute efficiency. Measured kernel times (a ``class`` column) refit a
    measured CPU's shape-class rate table instead (:func:`calibrate_kernels`).
    """
    if isinstance(measured, pd.DataFrame) and "class" in measured.columns:
        return calibrate_kernels(measured, cluster, devices)
    names = _devices(cluster, devices)
    table = cluster.devices.loc[names]
    if table["model"].nunique() > 1:
        raise ClusterError(f"calibrate: devices {names} are of several models "
                           f"{sorted(table['model'].unique())}; calibrate one model at a time")
    dev = table.iloc[0]
    work = _checked(measured)
    dtype = work["dtype"].astype(str) if "dtype" in work else pd.Series("float32", work.index)
    # rows at the 16-bit peak count as FP32 work scaled by the peaks' ratio; bfloat16 runs at
    # it only on devices with bf16 units (a V100 runs it at the FP32 rate)
    half = (dtype.eq("float16") | (dtype.eq("bfloat16") & bool(dev["bf16"]))).to_numpy()
    scale = np.where(half, dev["peak_flops_fp32"] / dev["peak_flops_fp16"], 1.0)
    work = work.assign(flops=work["flops"].to_numpy(float) * scale)
    fit = fit_rates(work, dev["peak_flops_fp32"] * dev["compute_efficiency"],
                    dev["mem_bandwidth"] * dev["memory_efficiency"], dev["launch_overhead"])
    flop_eff = fit["flop_rate"] / dev["peak_flops_fp32"]
    byte_eff = fit["byte_rate"] / dev["mem_bandwidth"]
    raise_peak = max(flop_eff, 1.0)
    return cluster.replace(
        devices=names, name=f"{cluster.name} (calibrated)", figures="calibrated",
        compute_efficiency=min(flop_eff, 1.0), memory_efficiency=min(byte_eff, 1.0),
        peak_flops_fp32=dev["peak_flops_fp32"] * raise_peak,
        peak_flops_fp16=dev["peak_flops_fp16"] * raise_peak,
        mem_bandwidth=dev["mem_bandwidth"] * max(byte_eff, 1.0),
        launch_overhead=fit["launch"])
