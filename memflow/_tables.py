"""Tables that keep plain numbers for code and show them in units for people.

A :class:`ReadableFrame` is a pandas DataFrame whose ``attrs["units"]`` gives the unit of some
of its columns: ``"bytes"``, ``"seconds"`` or ``"share"`` (a fraction). Its values stay plain
numbers — bytes, seconds, fractions — for code (``df["peak"]``, ``to_numpy``, ``to_csv``,
``to_json``). What a person reads — ``print(df)``, ``repr``, ``to_string`` and the table a
notebook shows — has them as ``"15.5 GiB"``, ``"12.3 ms"``, ``"87%"`` (``print`` and the
notebook under ``attrs["caption"]`` when there is one). Frames derived from it (a selection,
``assign``) keep the units of the columns they keep.

>>> df = ReadableFrame({"peak": [1.5 * 2**30], "busy": [0.0123], "used": [0.871]},
...                    index=["gpu0"], units={"peak": "bytes", "busy": "seconds", "used": "share"},
...                    caption="one step")
>>> print(df)
one step
          peak     busy used
gpu0  1.50 GiB  12.3 ms  87%
>>> float(df.loc["gpu0", "peak"])
1610612736.0
>>> print(df[["peak"]].assign(GiB=df["peak"] / 2**30))
one step
          peak  GiB
gpu0  1.50 GiB  1.5
>>> print(df.to_string(formatters={"busy": "{:.4f} s".format}))
          peak      busy used
gpu0  1.50 GiB  0.0123 s  87%
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import pandas as pd

from .errors import MemflowError
from ._units import format_bytes, format_seconds

__all__ = ["ReadableFrame", "UNIT_FORMATS"]

UNIT_FORMATS: dict[str, Callable[[float], str]] = {
    "bytes": format_bytes,
    "seconds": format_seconds,
    "share": "{:.0%}".format,
}
"""How a column of each unit reads: the units a :class:`ReadableFrame` knows."""


class ReadableFrame(pd.DataFrame):
    """A DataFrame that keeps numbers and prints them in ``units`` (column -> unit name of
    :data:`UNIT_FORMATS`), under ``caption``; both are kept in ``attrs``."""

    def __init__(self, data: Any = None, *args: Any, units: Mapping[str, str] | None = None,
                 caption: str | None = None, **kwargs: Any) -> None:
        super().__init__(data, *args, **kwargs)
        if units is not None:
            unknown = {c: u for c, u in units.items() if u not in UNIT_FORMATS}
            if unknown:
                raise MemflowError(f"ReadableFrame: unknown units {unknown}; valid: "
                                   f"{', '.join(UNIT_FORMATS)}")
            self.attrs["units"] = dict(units)
        if caption is not None:
            self.attrs["caption"] = caption

    @property
    def _constructor(self):
        return ReadableFrame

    def readable(self, raw: Any = ()) -> pd.DataFrame:
        """A plain DataFrame with the unit columns, except those in ``raw``, written out as
        text (what is displayed)."""
        out = pd.DataFrame(self, copy=True)
        out.attrs = {}
        for column, unit in self.attrs.get("units", {}).items():
            if column in out.columns and column not in raw:
                fmt = UNIT_FORMATS[unit]
                out[column] = [("" if pd.isna(v) else fmt(v)) for v in out[column]]
        return out

    def _caption(self) -> str:
        return str(self.attrs.get("caption") or "")

    def to_string(self, *args: Any, **kwargs: Any) -> str:
        """The table as text in units; columns given ``formatters`` get their plain numbers.
        (pandas' ``repr`` comes here; ``print`` adds the caption above.)"""
        formatters = kwargs.get("formatters")
        raw = formatters if isinstance(formatters, Mapping) else ()
        return self.readable(raw).to_string(*args, **kwargs)

    def __repr__(self) -> str:
        text = super().__repr__()
        return f"{self._caption()}\n{text}" if self._caption() else text

    def _repr_html_(self) -> str | None:
        table = self.readable()._repr_html_()
        caption = self._caption()
        if not caption or table is None:
            return table
        from html import escape
        return f"<div><p><b>{escape(caption)}</b></p>{table}</div>"
