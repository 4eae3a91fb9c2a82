"""Memory limits: the bytes each device of a cluster may hold, read from what a person writes.

Every planner, the search, the evaluator and the command line read a ``memory_limit`` here, so
they accept the same forms and answer a bad one with the same message:

* ``None`` — each device's capacity;
* a number of bytes (``12e9``) or a size (``"16GB"``, ``"16 GiB"``);
* a fraction of each device's capacity: a bare number between 0 and 1 (``0.8``) or a
  percentage (``"80%"``) — a limit under one byte means nothing else, so ``1`` is one byte,
  while a size with a unit is always bytes (``"0.5GB"``);

A limit that allows less than one byte on a device (``"0.5B"``, ``"1e-12%"``) is an error,
never a silent 0 B.
* a mapping ``{device: any of the above}`` for some devices (the others keep their capacity).

A limit never exceeds a device's capacity: the bytes allowed are the smaller of the two.

>>> from memflow.hardware import Cluster
>>> c = Cluster.preset("4xV100-16GB")
>>> (memory_limits(c, "8GiB") / 2**30).tolist()
[8.0, 8.0, 8.0, 8.0]
>>> (memory_limits(c, {"gpu1": "75%", "gpu2": 0.5, "gpu3": "64GB"}) / 2**30).tolist()
[16.0, 12.0, 8.0, 16.0]
"""
from __future__ import annotations

import math
import re
from typing import Any, Mapping

import numpy as np

from ..errors import ClusterError
from .cluster import parse_bytes

__all__ = ["memory_limits"]

VALID = ("memory_limit must be a positive number of bytes, a size such as '16GB' or '8 GiB', a "
         "fraction of capacity such as 0.8 or '80%', or a mapping of device names to these")
"""What a limit may be: the second half of every message about a limit that cannot be read."""


def memory_limits(cluster, limit: Any = None) -> np.ndarray:
    """Bytes allowed per device, in cluster order: each device's capacity, capped by ``limit``
    (any form of the module's list).

    >>> from memflow.hardware import Cluster
    >>> c = Cluster.preset("2xV100-16GB")
    >>> memory_limits(c).tolist() == memory_limits(c, "100%").tolist() == [16 * 2**30] * 2
    True
    >>> memory_limits(c, "lots")
    Traceback (most recent call last):
    ...
    memflow.errors.ClusterError: cannot read a size from 'lots': memory_limit must be a positive number of bytes, a size such as '16GB' or '8 GiB', a fraction of capacity such as 0.8 or '80%', or a mapping of device names to these
    >>> memory_limits(c, {"gpu1": -1})
    Traceback (most recent call last):
    ...
    memflow.errors.ClusterError: cannot read a size from -1 (for device 'gpu1'): memory_limit must be a positive number of bytes, a size such as '16GB' or '8 GiB', a fraction of capacity such as 0.8 or '80%', or a mapping of device names to these
    >>> memory_limits(c, "0.5B")
    Traceback (most recent call last):
    ...
    memflow.errors.ClusterError: memory_limit '0.5B' allows 0.5 bytes, less than one byte; memory_limit must be a positive number of bytes, a size such as '16GB' or '8 GiB', a fraction of capacity such as 0.8 or '80%', or a mapping of device names to these
    >>> memory_limits(c, {"gpu9": "8GB"})
    Traceback (most recent call last):
    ...
    memflow.errors.ClusterError: memory_limit names device 'gpu9', which is not in the cluster; devices: ['gpu0', 'gpu1']
    """
    capacity = cluster.arrays.memory.astype(np.float64)
    if not isinstance(limit, Mapping):
        return np.array([_bytes(limit, cap) for cap in capacity])
    names = [str(d) for d in cluster.devices.index]
    out = capacity.copy()
    for device, value in limit.items():
        if device not in names:
            raise ClusterError(f"memory_limit names device {device!r}, which is not in the "
                               f"cluster; devices: {names[:8]}")
        i = names.index(device)
        out[i] = _bytes(value, capacity[i], device)
    return out


def _bytes(value: Any, capacity: float, device: str | None = None) -> float:
    """The bytes ``value`` allows on a device of ``capacity`` bytes (at most the capacity)."""
    if value is None:
        return float(capacity)
    try:
        percent = isinstance(value, str) and re.fullmatch(r"\s*([0-9.eE+-]+)\s*%\s*", value)
        size = float(percent.group(1)) / 100 if percent else parse_bytes(value)
    except (ValueError, TypeError):       # parse_bytes' own ClusterError is a ValueError
        size = math.nan
    at = "" if device is None else f" (for device {device!r})"
    if isinstance(value, bool) or not size > 0:
        raise ClusterError(f"cannot read a size from {value!r}{at}: {VALID}")
    bare = not isinstance(value, str) or re.fullmatch(r"\s*[0-9.eE+-]+\s*", value)
    allowed = size * capacity if percent or (bare and size < 1) else size
    if allowed < 1:
        raise ClusterError(f"memory_limit {value!r}{at} allows {allowed:.3g} bytes, less than "
                           f"one byte; {VALID}")
    return float(min(capacity, allowed))
