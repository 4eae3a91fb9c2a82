"""The strategy document: a Strategy as JSON (format ``memflow.strategy/1``).

Fields that later versions added (``segment_break``, ``shard``, ``offload_optimizer``,
``sequence_parallel``, ``precision``) are written only when set, so a strategy that does not use
them writes the same document as before they existed, and an old document reads as their
defaults. The functions are also :class:`Strategy`'s methods (attached below), where users look
for them.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from .._jsonio import Fields, dumps, read_json, write_json
from ..errors import FileFormatError, StrategyError
from .policies import POLICIES
from .shard_levels import PRECISIONS, SHARD_LEVELS
from .strategy import SCHEDULES, Strategy

__all__ = ["FORMAT", "to_dict", "from_dict", "to_json", "from_json"]

FORMAT = "memflow.strategy/1"


def to_dict(strategy: Strategy) -> dict[str, Any]:
    """A JSON-ready description; :meth:`from_dict` rebuilds an equal strategy.

    ``segment_break`` is written only when some unit has one, so strategies without breaks
    write the same document as before breaks existed (and old documents read as no breaks);
    so are ``shard`` (when a unit is sharded), ``offload_optimizer`` (when a unit offloads),
    ``sequence_parallel`` (when a unit has it) and ``precision`` (when set): old documents
    read as unsharded, on the device, without sequence parallelism, with the simulator's
    precision.
    """
    doc = {"format": FORMAT, "name": strategy.name, "microbatches": strategy.microbatches,
           "schedule": strategy.schedule, "units": list(strategy.units),
           "policy": strategy.policies,
           "error_bound": [None if math.isnan(x) else x for x in strategy.error_bound.tolist()],
           "sample": strategy.sample.tolist(), "parameter": strategy.parameter.tolist(),
           "attribute": strategy.attribute.tolist(),
           "devices": [list(d) for d in strategy.devices], "stage": strategy.stage.tolist()}
    if strategy.segment_break.any():
        doc["segment_break"] = strategy.segment_break.tolist()
    if strategy.shard.any():
        doc["shard"] = strategy.shard_levels
    if strategy.offload_optimizer.any():
        doc["offload_optimizer"] = strategy.offload_optimizer.tolist()
    if strategy.sequence_parallel.any():
        doc["sequence_parallel"] = strategy.sequence_parallel.tolist()
    if strategy.precision is not None:
        doc["precision"] = strategy.precision
    return doc


def from_dict(doc: Mapping[str, Any], *, source: str = "strategy document",
              at: str = "") -> "Strategy":
    """Rebuild a strategy from :meth:`to_dict`'s output.

    Every field is type-checked; an error names ``source`` (the file), the field (under
    ``at`` when the strategy sits inside another document) and what is valid.

    >>> doc = Strategy(["a", "b"], devices=[("gpu0",)] * 2).to_dict()
    >>> Strategy.from_dict({**doc, "sample": [1, 2.5]}, source="s.json")
    Traceback (most recent call last):
    ...
    memflow.errors.FileFormatError: s.json: field 'sample' must be a list of 2 integers >= 1, got 2.5 at [1]
    >>> Strategy.from_dict({**doc, "policy": ["keep"]}, source="s.json")
    Traceback (most recent call last):
    ...
    memflow.errors.FileFormatError: s.json: field 'policy' must be a list of 2 policy names, got a list of 1
    """
    f = Fields(doc, source, at)
    fmt = f.get("format", f"{FORMAT!r}")
    if not (isinstance(fmt, str) and fmt.startswith("memflow.strategy")):
        raise FileFormatError(f"{source}: not a memflow strategy document (its "
                              f"{f.name('format')!r} is {fmt!r}, not 'memflow.strategy/…')")
    units = f.strs("units")
    n = len(units)
    codes = []
    for u, p in zip(units, f.list("policy", "policy names", length=n)):
        if not (isinstance(p, str) and p in POLICIES):
            raise f.fail("policy", f"one of {', '.join(POLICIES)}", p, f" for unit {u!r}")
        codes.append(POLICIES.index(p))
    bounds = f.numbers("error_bound", length=n, positive=True, nullable=True)
    devices = f.list("devices", "lists of device names", length=n)
    for i, d in enumerate(devices):
        if not (isinstance(d, list) and d and all(isinstance(x, str) for x in d)):
            raise f.fail("devices", f"a list of {n} non-empty lists of device names", d,
                         f" at [{i}] (unit {units[i]!r})")
    shard = f.list("shard", "shard levels", length=n, default=None)
    for u, v in zip(units, shard or ()):
        if v not in SHARD_LEVELS:
            raise f.fail("shard", f"one of {', '.join(SHARD_LEVELS)}", v, f" for unit {u!r}")
    try:
        return Strategy(units, devices=devices, policy=codes, shard=shard,
                   offload_optimizer=f.bools("offload_optimizer", length=n, default=None),
                   precision=f.str("precision", choices=PRECISIONS, default=None),
                   sequence_parallel=f.bools("sequence_parallel", length=n, default=None),
                   error_bound=[np.nan if x is None else x for x in bounds],
                   segment_break=f.bools("segment_break", length=n, default=None),
                   sample=f.ints("sample", length=n, least=1),
                   parameter=f.ints("parameter", length=n, least=1),
                   attribute=f.ints("attribute", length=n, least=1),
                   stage=f.ints("stage", length=n, least=-1),
                   microbatches=f.int("microbatches", least=1),
                   schedule=f.str("schedule", choices=SCHEDULES), name=f.str("name"))
    except StrategyError as exc:      # e.g. a segment break on a kept unit
        raise StrategyError(f"{source}: {exc}") from None


def to_json(strategy: Strategy, path: str | Path | None = None) -> str | Path:
    """JSON text, or, given ``path``, the file written atomically (its path returned)."""
    if path is not None:
        return write_json(path, strategy.to_dict())
    return dumps(strategy.to_dict())


def from_json(source: str | Path) -> "Strategy":
    """Read a strategy from JSON text or from a file written by :meth:`to_json`."""
    text = str(source)
    if isinstance(source, Path) or not text.lstrip().startswith("{"):
        return from_dict(read_json(source, kind="memflow.strategy"), source=text)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FileFormatError(f"strategy JSON is not valid at line {exc.lineno}, column "
                              f"{exc.colno} ({exc.msg})") from None
    return from_dict(doc, source="strategy JSON")


Strategy.to_dict = to_dict
Strategy.from_dict = staticmethod(from_dict)
Strategy.to_json = to_json
Strategy.from_json = staticmethod(from_json)
