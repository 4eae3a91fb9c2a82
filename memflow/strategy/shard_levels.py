"""The model-state vocabulary of a strategy: shard levels, precision modes, optimizers.

Declared once here; the strategy, its validation and JSON, the memory model, the simulator and
the search moves all read these tuples.

* :data:`SHARD_LEVELS` — per unit, what of its model states is split over the unit's
  data-parallel (``sample``) group, as ZeRO's stages and PyTorch FSDP do: ``none`` (DDP:
  every replica holds everything), ``optimizer`` (ZeRO-1), ``gradients`` (ZeRO-2: and the
  gradients, reduce-scattered), ``parameters`` (ZeRO-3, FSDP ``fully_shard``: and the
  parameters, all-gathered before forward and backward). Each level shards what the one
  before it does.
* :data:`PRECISIONS` — global: ``fp32``; ``amp`` (fp32 parameters, autocast compute);
  ``bf16`` (bf16 parameters and gradients, fp32 master weights and optimizer states: ZeRO's
  16 bytes per parameter with Adam); ``pure-bf16`` (everything bf16, no master copy).
* :data:`OPTIMIZERS` — the optimizer of the training recipe (a :class:`~memflow.Simulator`
  option, not searched: it changes convergence): its number of state tensors per parameter
  and their width (``None``: the precision's state width).

>>> SHARD_LEVELS.index("gradients"), PRECISIONS[-1]
(2, 'pure-bf16')
>>> shard_codes(["a", "b"], ["none", "parameters"]).tolist()
[0, 3]
>>> shard_codes(["a", "b"], ["none", "zero3"])
Traceback (most recent call last):
...
memflow.errors.StrategyError: unit 'b': unknown shard level 'zero3'; valid: none, optimizer, gradients, parameters
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..errors import StrategyError

__all__ = ["SHARD_LEVELS", "S_NONE", "S_OPTIMIZER", "S_GRADIENTS", "S_PARAMETERS",
           "PRECISIONS", "OPTIMIZERS", "shard_codes", "check_precision"]

SHARD_LEVELS = ("none", "optimizer", "gradients", "parameters")
S_NONE, S_OPTIMIZER, S_GRADIENTS, S_PARAMETERS = range(len(SHARD_LEVELS))
PRECISIONS = ("fp32", "amp", "bf16", "pure-bf16")
OPTIMIZERS = {"sgd": (0, None), "momentum": (1, None), "adam": (2, None), "adam8bit": (2, 1)}
"""optimizer -> (state tensors per parameter, bytes per state element; None: the precision's
state width). ``adam8bit`` is bitsandbytes' 8-bit Adam (block-wise quantized moments; its
per-block scales, 1 float per 2048 values, are left out)."""


def shard_codes(units: Sequence[str], levels: Any) -> np.ndarray:
    """Per unit the code of its shard level (an index of :data:`SHARD_LEVELS`): ``levels``
    is one level for every unit or one per unit (names or codes)."""
    n = len(units)
    if isinstance(levels, (str, int, np.integer)):
        levels = [levels] * n
    levels = list(levels)
    if len(levels) != n:
        raise StrategyError(f"shard: expected one level per unit ({n}), got {len(levels)}")
    out = np.empty(n, np.int8)
    for i, v in enumerate(levels):
        if isinstance(v, (int, np.integer)) and not isinstance(v, bool) \
                and 0 <= v < len(SHARD_LEVELS):
            out[i] = v
        elif isinstance(v, str) and v in SHARD_LEVELS:
            out[i] = SHARD_LEVELS.index(v)
        else:
            raise StrategyError(f"unit {units[i]!r}: unknown shard level {v!r}; valid: "
                                f"{', '.join(SHARD_LEVELS)}")
    return out


def check_precision(precision: str | None) -> str | None:
    """``precision`` if it is one of :data:`PRECISIONS` (or None: the simulator's default).

    >>> check_precision("fp16")
    Traceback (most recent call last):
    ...
    memflow.errors.StrategyError: unknown precision 'fp16'; valid: fp32, amp, bf16, pure-bf16
    """
    if precision is not None and precision not in PRECISIONS:
        raise StrategyError(f"unknown precision {precision!r}; valid: {', '.join(PRECISIONS)}")
    return precision
