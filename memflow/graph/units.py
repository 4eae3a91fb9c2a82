"""Which modules of a model become units: the granularity a capture is asked for.

``from_torch(..., units=...)`` accepts

* ``"leaves"`` (default): every leaf module (a module without children);
* ``"blocks"``: repeated blocks — modules with children that share their class with a sibling
  (the three ``InceptionA`` of Inception-v3) or that sit in a plain container
  (``nn.Sequential``, ``nn.ModuleDict``: the bottlenecks of a ResNet stage), every layer of an
  ``nn.ModuleList`` (the layers of a transformer, even just one, whatever their class) — and,
  outside every block, the leaves. Other plain containers are looked through;
* an ``int`` depth ``d``: the modules ``d`` levels below the root (``0`` is the root itself)
  and the leaves above that depth;
* a list of module paths (as ``model.named_modules()`` names them; ``"<root>"`` is the root).

Ops run inside a selected module belong to the outermost selected module on the stack; ops
outside every selected module are *glue* of the innermost module running them (see
``docs/data-model.md``).

>>> from torch import nn
>>> model = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 4), nn.ReLU()))
>>> sorted(select_units(model, "leaves"))
['0', '1.0', '1.1']
>>> sorted(select_units(model, 1))
['0', '1']
>>> select_units(model, ["1.2"])
Traceback (most recent call last):
...
memflow.errors.CaptureError: units: '1.2' is not a module of Sequential; close matches: 1.1, 1.0, 1
"""
from __future__ import annotations

import difflib
from collections import Counter
from typing import Any, Iterable

from torch import nn

from ..errors import CaptureError

__all__ = ["ROOT", "LOSS", "module_paths", "select_units", "describe_units", "enclosing_blocks"]

_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)

ROOT = "<root>"
"""Path of the model itself in unit names."""

LOSS = "<loss>"
"""Unit of the loss computation (``from_torch(..., loss_fn=...)``)."""


def module_paths(model: nn.Module) -> dict[nn.Module, str]:
    """Path of every module (first name of a module registered twice), the root as ``ROOT``."""
    return {m: (name or ROOT) for name, m in model.named_modules()}


def _children(m: nn.Module) -> list[nn.Module]:
    return list(m.children())


def _leaves(model: nn.Module, paths: dict[nn.Module, str]) -> set[str]:
    return {p for m, p in paths.items() if not _children(m)}


def _blocks(model: nn.Module, paths: dict[nn.Module, str]) -> set[str]:
    selected: set[str] = set()

    def visit(m: nn.Module) -> None:
        kids = _children(m)
        counts = Counter(type(k) for k in kids if _children(k) and not isinstance(k, _CONTAINERS))
        for k in kids:
            if not _children(k):
                selected.add(paths[k])          # a leaf outside every block
            elif isinstance(m, nn.ModuleList):
                selected.add(paths[k])          # a layer of a layer list, whatever its class
            elif isinstance(k, _CONTAINERS):
                visit(k)                        # otherwise a plain container is looked through
            elif counts[type(k)] > 1 or isinstance(m, _CONTAINERS):
                selected.add(paths[k])          # a block: nothing inside it is searched
            else:
                visit(k)

    if not _children(model):
        return {ROOT}
    visit(model)
    return selected


def enclosing_blocks(model: nn.Module, modules: Iterable[str]) -> list[str]:
    """Per module path, the block (``"blocks"`` granularity, a module with children) it is or
    lies in, ``""`` for none: the capture's ``block`` column. Tensor parallelism splits a block
    as a whole (Megatron's layer), so at a finer granularity its parameter-free units (norm
    neighbours, dropouts, residual adds, activations, attention glue) split with it.

    >>> from torch import nn
    >>> layer = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    >>> model = nn.Sequential(nn.Linear(4, 4), nn.ModuleList([layer]))
    >>> enclosing_blocks(model, ["0", "1.0.1", "1.0", "<root>"])
    ['', '1.0', '1.0', '']
    """
    paths = module_paths(model)
    by_path = {p: m for m, p in paths.items()}
    blocks = {b for b in _blocks(model, paths) if b != ROOT and _children(by_path[b])}
    out = []
    for path in modules:
        found = ""
        while path and path != ROOT:
            if path in blocks:
                found = path
                break
            path = path.rpartition(".")[0]
        out.append(found)
    return out


def _depth(model: nn.Module, paths: dict[nn.Module, str], depth: int) -> set[str]:
    selected: set[str] = set()

    def visit(m: nn.Module, d: int) -> None:
        kids = _children(m)
        if d == depth or not kids:
            selected.add(paths[m])
            return
        for k in kids:
            visit(k, d + 1)

    visit(model, 0)
    return selected


def select_units(model: nn.Module, units: Any) -> set[str]:
    """The module paths selected as units by ``units`` (see the module docstring)."""
    paths = module_paths(model)
    if isinstance(units, str):
        if units == "leaves":
            return _leaves(model, paths) or {ROOT}
        if units == "blocks":
            return _blocks(model, paths)
        raise CaptureError(f"units={units!r} is not a granularity; valid: 'leaves', 'blocks', "
                           "an int depth >= 0, or a list of module paths")
    if isinstance(units, bool) or not isinstance(units, (int, list, tuple, set, frozenset)):
        raise CaptureError(f"units must be 'leaves', 'blocks', an int depth or a list of module "
                           f"paths; got {type(units).__name__}")
    if isinstance(units, int):
        if units < 0:
            raise CaptureError(f"units={units}: a depth must be >= 0 (0 is the whole model)")
        return _depth(model, paths, units)
    return _explicit(model, paths, units)


def _explicit(model: nn.Module, paths: dict[nn.Module, str], names: Iterable[Any]) -> set[str]:
    known = set(paths.values())
    selected = set()
    for name in names:
        name = ROOT if name == "" else name
        if not isinstance(name, str) or name not in known:
            close = difflib.get_close_matches(str(name), sorted(known), n=3, cutoff=0.5)
            hint = f"; close matches: {', '.join(close)}" if close else \
                f"; module paths look like: {', '.join(sorted(known - {ROOT})[:5])}"
            raise CaptureError(f"units: {name!r} is not a module of "
                               f"{type(model).__name__}{hint}")
        selected.add(name)
    if not selected:
        raise CaptureError("units: the list of module paths is empty; name at least one module "
                           "(or use 'leaves')")
    return selected


def describe_units(units: Any) -> Any:
    """``units`` as JSON-ready data for ``graph.meta["units"]``.

    >>> describe_units(("b", "a"))
    ['b', 'a']
    """
    if isinstance(units, (str, int)):
        return units
    return [str(u) for u in units]
