"""Statistical efficiency: how many epochs training needs to reach its target at a global batch.

Larger global batches take fewer steps but, beyond a point, more epochs. The default curve is
the critical-batch form of McCandlish, Kaplan, Amodei et al., "An empirical model of
large-batch training" (2018), which Shallue et al. (JMLR 2019) confirm in shape across models:
steps ``S(B) = S_min · (1 + B_noise / B)`` and samples ``E(B) = E_min · (1 + B / B_noise)``, so
the epochs to the target are ``epochs_min · (1 + B / B_noise)``: flat for batches well below
the noise scale ``B_noise``, linear beyond it.

:data:`DEFAULTS` gives a curve per model that Pal et al. studied. Their numbers are assumptions
of the right order, not measurements: ``B_noise`` from the batch sizes beyond which published
large-batch runs of the family needed retuning or more epochs (ImageNet CNNs ~8k images:
Goyal et al. 2017, Shallue et al. 2019; GNMT ~2k sentence pairs: MLPerf v0.5–0.6 reference
batches; LSTM language models on 1B words ~4k sequences of 20 tokens: Shallue et al.'s LM1B
curves), ``epochs_min`` the reference schedules' epochs (90, 6, 5) and the datasets' sizes.
Give your own measurements instead: a :class:`Measured` table (``global_batch``, ``epochs``:
epochs to the target measured at each batch, interpolated in log-log) or any function
``global_batch -> epochs``. Bad input is a :class:`~memflow.errors.PlanError` that names the
field: a non-positive or non-finite ``b_noise`` / ``epochs_min``, a table row whose
``global_batch`` or ``epochs`` is not a positive number, fewer than two distinct batches, or a
function that answers anything but a positive finite number of epochs.

>>> c = CriticalBatch(b_noise=1000, epochs_min=10)
>>> c(100), c(1000), c(10000)
(11.0, 20.0, 110.0)
>>> m = Measured(pd.DataFrame({"global_batch": [256, 1024, 4096], "epochs": [10, 12, 24]}))
>>> round(m(512), 2), round(m(8192), 2)
(10.95, 33.94)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pandas as pd

from ..errors import PlanError

__all__ = ["CriticalBatch", "Measured", "DEFAULTS", "DATASETS", "convergence_model"]


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and bool(
        np.isfinite(value) and value > 0)


@dataclass(frozen=True)
class CriticalBatch:
    """Epochs to target: ``epochs_min · (1 + B / b_noise)`` (McCandlish et al. 2018)."""

    b_noise: float
    epochs_min: float

    def __post_init__(self):
        for field in ("b_noise", "epochs_min"):
            value = getattr(self, field)
            if not _positive(value):
                raise PlanError(f"CriticalBatch: {field} must be a positive finite number "
                                f"(b_noise in samples, epochs_min in epochs), got {value!r}")

    def __call__(self, global_batch: float) -> float:
        return float(self.epochs_min * (1.0 + global_batch / self.b_noise))


class Measured:
    """Epochs to target interpolated from measurements: a DataFrame with ``global_batch`` and
    ``epochs`` columns, linear in log-log between points and extended beyond them along the
    slope of the outermost two points (at least flat)."""

    def __init__(self, table: pd.DataFrame):
        if not isinstance(table, pd.DataFrame) or not {"global_batch", "epochs"} <= set(table):
            raise PlanError("a measured convergence table needs the columns 'global_batch' and "
                            "'epochs' (one row per measured batch size)")
        cols = {}
        for field in ("global_batch", "epochs"):
            values = pd.to_numeric(table[field], errors="coerce").to_numpy(np.float64)
            bad = np.flatnonzero(~(np.isfinite(values) & (values > 0)))
            if len(bad):
                value = table[field].iloc[bad[0]]
                value = value.item() if isinstance(value, np.generic) else value
                raise PlanError(f"measured convergence table: column {field!r} must hold "
                                f"positive finite numbers; row {table.index[bad[0]]!r} has "
                                f"{value!r}")
            cols[field] = values
        b, e = cols["global_batch"], cols["epochs"]
        if len(b) < 2 or len(np.unique(b)) != len(b):
            raise PlanError(f"measured convergence table: column 'global_batch' needs at least "
                            f"two distinct batch sizes (one row each), got {b.tolist()}")
        order = np.argsort(b)
        self.x, self.y = np.log(b[order]), np.log(e[order])

    def __call__(self, global_batch: float) -> float:
        x, y = self.x, self.y
        g = float(np.log(global_batch))
        if g < x[0]:
            slope = max((y[1] - y[0]) / (x[1] - x[0]), 0.0)
            return float(np.exp(y[0] + slope * (g - x[0])))
        if g > x[-1]:
            slope = max((y[-1] - y[-2]) / (x[-1] - x[-2]), 0.0)
            return float(np.exp(y[-1] + slope * (g - x[-1])))
        return float(np.exp(np.interp(g, x, y)))


DEFAULTS: dict[str, CriticalBatch] = {
    "inception_v3": CriticalBatch(b_noise=8192, epochs_min=90),
    "gnmt": CriticalBatch(b_noise=2048, epochs_min=6),
    "biglstm": CriticalBatch(b_noise=4096, epochs_min=5),
}
"""Default curves per zoo model (assumptions; see the module)."""

DATASETS: dict[str, int] = {
    "inception_v3": 1_281_167,     # ImageNet-1k training images
    "gnmt": 4_500_000,             # WMT16 English-German sentence pairs
    "biglstm": 40_000_000,         # One Billion Word: ~0.8e9 words in sequences of 20
}
"""Samples per epoch of the datasets the defaults refer to."""


def convergence_model(convergence: Any, model: str | None) -> Callable[[float], float]:
    """A function ``global_batch -> epochs`` from what a user gave (see the module); None
    takes the default of ``model``. Whatever it is, each value it returns is checked: a
    positive finite number of epochs, or a :class:`PlanError` naming the batch.

    >>> convergence_model(lambda b: 0.0, None)(256)
    Traceback (most recent call last):
    ...
    memflow.errors.PlanError: convergence: epochs to the target at global batch 256 must be a positive finite number, got 0.0
    """
    if convergence is None:
        if model not in DEFAULTS:
            raise PlanError(f"no default convergence curve for model {model!r} (defaults: "
                            f"{', '.join(DEFAULTS)}); pass convergence=CriticalBatch(b_noise="
                            "..., epochs_min=...), a DataFrame of measurements or a function")
        return DEFAULTS[model]
    if isinstance(convergence, str):
        return convergence_model(None, convergence)
    if isinstance(convergence, (CriticalBatch, Measured)):
        return convergence
    if isinstance(convergence, pd.DataFrame):
        return Measured(convergence)
    if callable(convergence):
        return _Checked(convergence)
    raise PlanError(f"convergence must be None, a model name, a CriticalBatch, a DataFrame "
                    f"(global_batch, epochs) or a function, got {type(convergence).__name__}")


@dataclass(frozen=True)
class _Checked:
    """A user's function ``global_batch -> epochs`` whose answers are checked."""

    fn: Callable[[float], Any]

    def __call__(self, global_batch: float) -> float:
        epochs = self.fn(global_batch)
        if not _positive(epochs):
            raise PlanError(f"convergence: epochs to the target at global batch {global_batch} "
                            f"must be a positive finite number, got {epochs!r}")
        return float(epochs)
