"""Sizes and durations as people write them: read ``"16GB"`` or ``"8 GiB"``, write
``"1.50 MiB"`` and ``"12.3 ms"``.

>>> format_bytes(parse_bytes("1.5 KiB"))
'1.50 KiB'
"""
from __future__ import annotations

import re

from .errors import ClusterError

__all__ = ["BINARY_UNITS", "parse_bytes", "format_bytes", "byte_unit", "format_seconds"]

BINARY_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")
"""The units memflow writes sizes in, each 1024 times the one before."""
_DECIMAL_UNITS = ("B", "kB", "MB", "GB", "TB")
_UNITS = {"": 1, **{u.lower(): 1000 ** i for i, u in enumerate(_DECIMAL_UNITS)},
          **{u.lower(): 1024 ** i for i, u in enumerate(BINARY_UNITS)}}


def parse_bytes(value: float | int | str) -> float:
    """A size in bytes from a number or a string such as ``"16GB"`` or ``"8 GiB"``.

    >>> parse_bytes("16GB"), parse_bytes("1.5 KiB"), parse_bytes(3)
    (16000000000.0, 1536.0, 3.0)
    """
    if isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9.eE+-]+)\s*([a-zA-Z]*)\s*", value)
        unit = m.group(2).lower() if m else None
        if m is None or unit not in _UNITS:
            raise ClusterError(f"cannot read a size from {value!r}; write e.g. '16GB', '8GiB' "
                               f"or a number of bytes (units: {sorted(u for u in _UNITS if u)})")
        return float(m.group(1)) * _UNITS[unit]
    return float(value)


def format_bytes(n: float) -> str:
    """Bytes in the largest binary unit below them, to three significant figures (whole
    bytes below 1 KiB, thousands separated above 999 TiB).

    >>> format_bytes(1536 * 1024), format_bytes(100), format_bytes(20.5 * 2**40)
    ('1.50 MiB', '100 B', '20.5 TiB')
    >>> format_bytes(3 * 2**30), format_bytes(768.1 * 2**20), format_bytes(0)
    ('3.00 GiB', '768 MiB', '0 B')
    """
    name, size = byte_unit(n)
    n = float(n) / size
    if name == BINARY_UNITS[0]:
        return f"{n:.0f} B"
    return f"{n:.2f} {name}" if abs(n) < 10 else f"{n:.1f} {name}" if abs(n) < 100 else \
        f"{n:,.0f} {name}"


def byte_unit(n: float) -> tuple[str, float]:
    """The largest binary unit in which ``n`` bytes is at least 1, and its size.

    >>> byte_unit(3 * 2**30), byte_unit(5000), byte_unit(0)
    (('GiB', 1073741824.0), ('KiB', 1024.0), ('B', 1.0))
    """
    name, size = BINARY_UNITS[0], 1.0
    for unit in BINARY_UNITS[1:]:
        if abs(n) < size * 1024:
            break
        name, size = unit, size * 1024
    return name, size


def format_seconds(t: float) -> str:
    """A duration in the unit that reads best: ``'12.3 ms'``, ``'1.25 s'``.

    >>> format_seconds(0.0123), format_seconds(1.25), format_seconds(4e-6)
    ('12.3 ms', '1.25 s', '4 µs')
    """
    t = float(t)
    if abs(t) >= 1:
        return f"{t:.3g} s"
    if abs(t) >= 1e-3:
        return f"{t * 1e3:.3g} ms"
    return f"{t * 1e6:.3g} µs"
