"""JSON files written atomically and read with errors that name the file.

memflow never pickles: strategies, graphs and search states are JSON. Writes go to a temporary
file in the same folder, are flushed to disk and then renamed over the target, so a crash
leaves either the old file or the new one, never half of one.
"""
from __future__ import annotations

import json
import math
import os
import secrets
from pathlib import Path
from typing import Any

from .errors import FileFormatError

__all__ = ["write_json", "write_text", "read_json", "dumps", "Fields"]


def _default(obj: Any) -> Any:
    # numpy scalars and arrays reach us from DataFrames; JSON has no such types.
    if hasattr(obj, "item") and getattr(obj, "ndim", 1) == 0:
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"cannot write {type(obj).__name__} to JSON")


def _clean(obj: Any) -> Any:
    # JSON has no NaN or infinity; write them as null so every reader can parse the file.
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def dumps(obj: Any, *, indent: int | None = 1) -> str:
    """Serialize ``obj`` to strict JSON text (NaN becomes null, numpy values become numbers)."""
    return json.dumps(_clean(json.loads(json.dumps(obj, default=_default))), indent=indent,
                      allow_nan=False)


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (temporary file, fsync, rename); the path.

    The temporary file is opened like a plain ``open(path, "w")``, so the file gets the
    permissions the umask gives (``mkstemp`` would make it 0600); its random name keeps two
    writers of one path apart.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    try:
        with open(tmp, "x", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_json(path: str | os.PathLike, obj: Any, *, indent: int | None = 1) -> Path:
    """Write ``obj`` as JSON to ``path`` atomically and return the path."""
    return write_text(path, dumps(obj, indent=indent))


def read_json(path: str | os.PathLike, *, kind: str | None = None) -> Any:
    """Read a JSON file; if ``kind`` is given, its ``"format"`` field must start with it.

    Raises :class:`~memflow.errors.FileFormatError` naming the file when it is missing, is not
    JSON, or holds another kind of document.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileFormatError(f"{path}: no such file") from None
    except OSError as exc:
        raise FileFormatError(f"{path}: cannot be read ({exc})") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FileFormatError(
            f"{path}: not valid JSON at line {exc.lineno}, column {exc.colno} ({exc.msg}); "
            "the file is corrupt or was not written by memflow") from None
    if kind is not None:
        fmt = doc.get("format") if isinstance(doc, dict) else None
        if not isinstance(fmt, str) or not fmt.startswith(kind):
            raise FileFormatError(
                f"{path}: expected a {kind!r} document, found format {fmt!r}")
    return doc


_MISSING = object()


class Fields:
    """The fields of one JSON object, read with type checks whose errors name the file, the
    field and what would be valid (a :class:`~memflow.errors.FileFormatError`).

    ``source`` names the file (or "strategy document" for one given in memory) and ``at`` the
    object's place in it, so a field deep in a saved search reads ``chain.current.sample``.

    >>> f = Fields({"sample": [1, 2.5], "beta": "hot"}, "plan/strategy.json")
    >>> f.ints("sample", length=2, least=1)
    Traceback (most recent call last):
    ...
    memflow.errors.FileFormatError: plan/strategy.json: field 'sample' must be a list of 2 integers >= 1, got 2.5 at [1]
    >>> f.number("beta", positive=True)
    Traceback (most recent call last):
    ...
    memflow.errors.FileFormatError: plan/strategy.json: field 'beta' must be a number > 0, got 'hot'
    >>> f.int("microbatches")
    Traceback (most recent call last):
    ...
    memflow.errors.FileFormatError: plan/strategy.json: lacks the field 'microbatches' (an integer)
    """

    def __init__(self, doc: Any, source: str, at: str = ""):
        self.source, self.at = str(source), at
        if not isinstance(doc, dict):
            where = f"field {at!r}" if at else "the document"
            raise FileFormatError(f"{self.source}: {where} must be a JSON object, "
                                  f"got {_show(doc)}")
        self.doc = doc

    def name(self, key: str) -> str:
        """The field's full name: ``chain.current.sample``."""
        return f"{self.at}.{key}" if self.at else key

    def fail(self, key: str, valid: str, value: Any, where: str = "") -> FileFormatError:
        """The error for field ``key`` holding ``value`` where ``valid`` was expected."""
        return FileFormatError(f"{self.source}: field {self.name(key)!r} must be {valid}, "
                               f"got {_show(value)}{where}")

    def get(self, key: str, valid: str, default: Any = _MISSING) -> Any:
        """The raw value (``default`` when absent, if given; else absence is an error)."""
        if key in self.doc:
            return self.doc[key]
        if default is _MISSING:
            raise FileFormatError(f"{self.source}: lacks the field {self.name(key)!r} ({valid})")
        return default

    def sub(self, key: str) -> "Fields":
        """The object under ``key`` as :class:`Fields`."""
        return Fields(self.get(key, "a JSON object"), self.source, self.name(key))

    # ----------------------------------------------------------------- single values
    def _one(self, key, valid, ok, default, nullable=False):
        value = self.get(key, valid, default)
        if (value is None and nullable) or (value is default and default is not _MISSING):
            return value
        if not ok(value):
            raise self.fail(key, valid, value)
        return value

    def int(self, key: str, *, least: int | None = None, default: Any = _MISSING) -> int:
        """An integer (never a float or a bool), at least ``least`` when given."""
        valid = "an integer" + ("" if least is None else f" >= {least}")
        return self._one(key, valid, lambda v: _is_int(v, least), default)

    def number(self, key: str, *, positive: bool = False, least: float | None = None,
               nullable: bool = False, default: Any = _MISSING) -> float | None:
        """A finite number (``> 0`` if ``positive``, ``>= least`` when given); ``null`` too
        if ``nullable``."""
        valid = ("a number" + (" > 0" if positive else "" if least is None else f" >= {least}")
                 + (" or null" if nullable else ""))
        value = self._one(key, valid, lambda v: _is_number(v, positive, least), default,
                          nullable)
        return value if value is None else float(value)

    def bool(self, key: str, *, default: Any = _MISSING) -> bool:
        """``true`` or ``false``."""
        return self._one(key, "true or false", lambda v: isinstance(v, bool), default)

    def str(self, key: str, *, choices: Any = None, nullable: bool = False,
            default: Any = _MISSING) -> str | None:
        """A string (one of ``choices`` when given); ``null`` too if ``nullable``."""
        valid = (f"one of {', '.join(map(repr, choices))}" if choices is not None
                 else "a string") + (" or null" if nullable else "")
        return self._one(key, valid, lambda v: isinstance(v, str) and
                         (choices is None or v in choices), default, nullable)

    # ----------------------------------------------------------------- lists
    def list(self, key: str, valid: str, *, length: int | None = None,
             default: Any = _MISSING) -> list:
        """A list (of ``length`` items when given); ``valid`` says what its items are."""
        what = f"a list of {length} {valid}" if length is not None else f"a list of {valid}"
        value = self.get(key, what, default)
        if value is default and default is not _MISSING:
            return value
        if not isinstance(value, list):
            raise self.fail(key, what, value)
        if length is not None and len(value) != length:
            raise FileFormatError(f"{self.source}: field {self.name(key)!r} must be {what}, "
                                  f"got a list of {len(value)}")
        return value

    def _items(self, key, valid, ok, length, default, nullable=False):
        items = self.list(key, valid, length=length, default=default)
        if items is default and default is not _MISSING:
            return items
        what = f"a list of {length} {valid}" if length is not None else f"a list of {valid}"
        for i, v in enumerate(items):
            if not ((v is None and nullable) or ok(v)):
                raise self.fail(key, what, v, f" at [{i}]")
        return items

    def ints(self, key: str, *, length: int | None = None, least: int | None = None,
             default: Any = _MISSING) -> list[int]:
        """A list of integers (each ``>= least`` when given)."""
        valid = "integers" + ("" if least is None else f" >= {least}")
        return self._items(key, valid, lambda v: _is_int(v, least), length, default)

    def numbers(self, key: str, *, length: int | None = None, positive: bool = False,
                nullable: bool = False, default: Any = _MISSING) -> list:
        """A list of finite numbers (``> 0`` if ``positive``; ``null`` too if ``nullable``)."""
        valid = ("numbers" + (" > 0" if positive else "") + (" or nulls" if nullable else ""))
        return self._items(key, valid, lambda v: _is_number(v, positive, None), length,
                           default, nullable)

    def bools(self, key: str, *, length: int | None = None, default: Any = _MISSING) -> list:
        """A list of ``true``/``false``."""
        return self._items(key, "booleans", lambda v: isinstance(v, bool), length, default)

    def strs(self, key: str, *, length: int | None = None, default: Any = _MISSING) -> list:
        """A list of strings."""
        return self._items(key, "strings", lambda v: isinstance(v, str), length, default)


def _is_int(v: Any, least: int | None) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and (least is None or v >= least)


def _is_number(v: Any, positive: bool, least: float | None) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            and (not positive or v > 0) and (least is None or v >= least))


def _show(value: Any) -> str:
    """A value as a message quotes it: its repr, shortened; JSON's null as null."""
    if value is None:
        return "null"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
