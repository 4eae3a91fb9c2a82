"""Which stretch of a model's forward each unit of a strategy is, as module paths and calls.

A unit is a span of the forward attributed to one module (``docs/data-model.md``): a whole call
of a selected module (role ``module``), or a module's own code between the calls of its child
units (role ``glue``); the k-th span of the same module is named ``path#k``. Export follows
these spans at run time with module hooks (:mod:`memflow.export.tracker`).

The spans come from the graph when one is given (its ``module``, ``role`` and ``call``
columns). Without a graph they follow from the unit names alone, by the capture rules: ops
inside a selected module belong to it, so a unit whose module has another unit *inside* it
cannot be a selected module — it is that module's glue.

>>> spans = unit_spans(["<root>", "wte", "<root>#2", "h.0.attn.qkv", "h.0.attn", "h.0.attn#2"])
>>> [(s.module, s.role, s.call) for s in spans][:3]
[('<root>', 'glue', 1), ('wte', 'module', 1), ('<root>', 'glue', 2)]
>>> spans[4].role, spans[3].role
('glue', 'module')
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from torch import nn

from ..errors import ExportError
from ..graph.units import LOSS, ROOT, module_paths

__all__ = ["Span", "unit_spans", "within", "check_modules"]


@dataclass(frozen=True)
class Span:
    """One unit as a stretch of the forward: the ``call``-th span of module path ``module``."""

    index: int
    name: str
    module: str
    role: str      # "module" (a whole call of a selected module) or "glue" (its own code)
    call: int


def within(path: str, ancestor: str) -> bool:
    """Whether module ``path`` is ``ancestor`` or lies inside it.

    >>> within("h.0.attn", "h.0"), within("h.01", "h.0"), within("fc", ROOT)
    (True, False, True)
    """
    return ancestor == ROOT or path == ancestor or path.startswith(ancestor + ".")


def _split(name: str) -> tuple[str, int]:
    path, sep, k = name.rpartition("#")
    if sep and k.isdigit() and int(k) >= 2:
        return path, int(k)
    return name, 1


def unit_spans(units: Sequence[str], graph=None) -> list[Span]:
    """The spans of ``units`` (a strategy's unit names in execution order).

    With ``graph`` (an :class:`~memflow.graph.OpGraph` of the same units) its columns are
    used; a graph with other units is an :class:`~memflow.errors.ExportError`.
    """
    units = [str(u) for u in units]
    if graph is not None:
        if graph.names != units:
            other = next((u for u in units if u not in graph), None)
            raise ExportError(
                f"the strategy's units are not the graph's: {other!r} is not in the graph"
                if other is not None else "the strategy lists the graph's units in another "
                "order; build the strategy from this graph")
        rows = graph.units
        return [Span(i, u, str(rows.at[u, "module"]), str(rows.at[u, "role"]),
                     int(rows.at[u, "call"])) for i, u in enumerate(units)]
    parsed = [_split(u) for u in units]
    paths = {p for p, _ in parsed}
    spans = []
    for i, (name, (path, call)) in enumerate(zip(units, parsed)):
        inner = any(q != path and within(q, path) for q in paths)
        spans.append(Span(i, name, path, "glue" if inner else "module", call))
    return spans


def check_modules(model: nn.Module, spans: Sequence[Span]) -> dict[str, nn.Module]:
    """Module of every span's path (``<loss>`` excluded); an unknown path names the unit.

    >>> check_modules(nn.Sequential(nn.Linear(2, 2)), unit_spans(["1"]))
    Traceback (most recent call last):
    ...
    memflow.errors.ExportError: unit '1': the model has no module '1'; its modules look like: 0
    """
    modules = {p: m for m, p in module_paths(model).items()}
    for s in spans:
        if s.module != LOSS and s.module not in modules:
            known = ", ".join(sorted(p for p in modules if p != ROOT)[:5])
            raise ExportError(f"unit {s.name!r}: the model has no module {s.module!r}; its "
                              f"modules look like: {known}")
    return modules
