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

__all__ = ["write_json", "write_text", "read_json", "dumps"]


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
