"""Follow a forward unit by unit: module hooks turn module calls into unit starts and ends.

A :class:`UnitTracker` walks the strategy's spans (:mod:`memflow.export.spans`) in order while
the model runs. Capture makes a new span whenever the owner of the running ops changes — the
outermost selected module on the module stack, else the innermost module (its glue) — so at
each module call or return the next span is known:

* entering module ``P``: the next span is a whole call of ``P`` (a module unit, open until
  ``P`` returns; nothing inside it is looked at), or ``P``'s glue (its code starts with its
  own ops), or a span inside ``P`` (the caller's glue, if open, ends here); any other call is
  *transparent* — a module that runs no ops of a unit of its own, as capture also sees it;
* returning from ``P``: the span of ``P`` ends; if the next span is glue of the module now
  running, that module's own code resumes with it.

Units that never started by the end of the forward mean the model ran differently from the
graph the strategy was made for; :meth:`UnitTracker.finish` raises then, before any backward.

>>> import torch
>>> from torch import nn
>>> from memflow.export.spans import unit_spans
>>> model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
>>> seen = []
>>> tracker = UnitTracker(model, unit_spans(["0", "1"]),
...                       lambda i: seen.append(f"start {i}"), lambda i: seen.append(f"end {i}"))
>>> with tracker.running():
...     _ = model(torch.ones(1, 2))
>>> seen
['start 0', 'end 0', 'start 1', 'end 1']
>>> tracker.remove()
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Sequence

from torch import nn

from ..errors import ExportError
from ..graph.units import LOSS
from .spans import Span, check_modules, within

__all__ = ["UnitTracker"]

_TRANSPARENT, _LIVE, _UNIT = range(3)


class UnitTracker:
    """Calls ``on_start(i)`` / ``on_end(i)`` as unit ``i`` of ``spans`` begins and ends.

    The hooks do nothing outside :meth:`running`, so the model still runs plainly when called
    directly. ``<loss>`` spans are not part of the model and are skipped.
    """

    def __init__(self, model: nn.Module, spans: Sequence[Span],
                 on_start: Callable[[int], None], on_end: Callable[[int], None]):
        self.spans = [s for s in spans if s.module != LOSS]
        check_modules(model, self.spans)
        self.on_start, self.on_end = on_start, on_end
        self._paths = {m: p for p, m in check_modules(model, []).items()}
        self._active = False
        self._handles = []
        for m in self._paths:
            self._handles.append(m.register_forward_pre_hook(self._pre))
            self._handles.append(m.register_forward_hook(self._post))
        self._reset()

    def _reset(self) -> None:
        self.pos = 0                      # next span to start
        self.open: int | None = None      # span running now
        self._depth = 0                   # module calls nested inside an open module unit
        self._stack: list[tuple[str, int]] = []

    def remove(self) -> None:
        """Take the hooks off the model."""
        for h in self._handles:
            h.remove()
        self._handles = []

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Track one forward; raise if it did not run every unit (see :meth:`finish`).

        If the forward raises, no ``on_end`` is called for the unit running then: the caller
        unwinds what its ``on_start`` set up.
        """
        self._reset()
        self._active = True
        try:
            yield
        finally:
            self._active = False
        self.finish()

    def finish(self) -> None:
        """Raise :class:`~memflow.errors.ExportError` unless every unit ran, in order."""
        if self.pos < len(self.spans):
            missing = self.spans[self.pos]
            after = f" (after {self.spans[self.pos - 1].name!r})" if self.pos else ""
            raise ExportError(
                f"unit {missing.name!r} did not run{after}: the model ran differently from "
                "the graph the strategy was made for (other inputs or another branch?); "
                "capture the graph with the inputs you train with")

    # ------------------------------------------------------------------ spans
    def _open(self) -> None:
        self.open = self.pos
        self.pos += 1
        self.on_start(self.open)

    def _close(self) -> None:
        i, self.open = self.open, None
        self.on_end(i)

    def _next(self) -> Span | None:
        return self.spans[self.pos] if self.pos < len(self.spans) else None

    def _close_glue(self) -> None:
        if self.open is not None and self.spans[self.open].role == "glue":
            self._close()

    def _resume_glue(self) -> None:
        live = next((p for p, kind in reversed(self._stack) if kind != _TRANSPARENT), None)
        nxt = self._next()
        if live is not None and nxt is not None and nxt.role == "glue" and nxt.module == live:
            self._open()

    # ------------------------------------------------------------------ hooks
    def _pre(self, module: nn.Module, args: Any) -> None:
        if not self._active:
            return
        if self._depth:                   # inside a module unit: all of it is that unit
            self._depth += 1
            return
        path = self._paths[module]
        nxt = self._next()
        if nxt is not None and nxt.module == path:
            self._close_glue()
            self._stack.append((path, _UNIT if nxt.role == "module" else _LIVE))
            self._open()
            self._depth = 1 if nxt.role == "module" else 0
        elif nxt is not None and within(nxt.module, path):
            self._close_glue()
            self._stack.append((path, _LIVE))
        else:
            self._stack.append((path, _TRANSPARENT))

    def _post(self, module: nn.Module, args: Any, output: Any) -> None:
        if not self._active:
            return
        if self._depth > 1:
            self._depth -= 1
            return
        if not self._stack:
            return
        _, kind = self._stack.pop()
        if kind == _TRANSPARENT:
            return
        if kind == _UNIT:
            self._depth = 0
            self._close()
        else:
            self._close_glue()
        self._resume_glue()
