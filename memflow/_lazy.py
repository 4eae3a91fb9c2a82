"""Names of a package that load on first use (PEP 562), so importing the package stays cheap.

>>> getattr_, dir_ = lazy_names("memflow.errors", {"MemflowError": "memflow.errors"})
>>> getattr_("MemflowError").__name__
'MemflowError'
"""
from __future__ import annotations

import importlib
import sys
from typing import Any, Callable, Mapping, Sequence

__all__ = ["lazy_names"]


def lazy_names(package: str, exports: Mapping[str, str], submodules: Sequence[str] = ()
               ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: ``exports`` maps a public name to the
    module defining it, ``submodules`` are loaded as ``package.<name>``. A loaded name is cached
    in the package's globals, so later lookups are plain attribute reads."""
    names = sorted(exports) + list(submodules)

    def __getattr__(name: str) -> Any:
        if name in exports:
            value = getattr(importlib.import_module(exports[name]), name)
        elif name in submodules:
            value = importlib.import_module(f"{package}.{name}")
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(names))

    return __getattr__, __dir__
