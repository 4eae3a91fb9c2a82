"""PinTable: tick units to pin their memory policy and model states in a paused search.

One row per unit of the search's graph — a checkbox named after the unit (ticked = pinned), the
policy to pin it to (``recompute`` by default, or any other of the policy table's), its shard
level and optimizer place (device or host; shown as in the best strategy until pinned), and the
unit's saved bytes and its policy in the best strategy so far. A tick calls
``search.pin([unit], policy=..., config={"shard": ..., "optimizer_place": ...})`` at once, an
untick ``search.unpin([unit])``; the precision menu above the rows pins the global precision
(``search.pin_precision``; "search chooses" unpins it). The pins live in the search, never
here; a pin the search refuses (one export cannot run) is explained and undone. The rows are a page of ``page_size`` units, filtered by name, so a
model of hundreds of units costs a few dozen widgets. A dashboard passes ``call`` (its
runner's :meth:`~memflow_widgets.runner.SearchRunner.call`) so that ticks reach the search on
the thread that steps it.
"""
from __future__ import annotations

import html
from typing import Any, Callable

import ipywidgets

from memflow.search.space import OPTIMIZER_PLACES
from memflow.strategy import POLICIES, PRECISIONS, SHARD_LEVELS

from .style import format_bytes

__all__ = ["PinTable"]


def pinned_policies(search: Any) -> dict[str, str]:
    """``{unit: policy}`` of the search's pinned units (``"compress:0.001"`` → ``"compress"``)."""
    return {str(u): str(p).split(":", 1)[0] for u, p in search.pins.items()}


class _Row:
    """The widgets of one line of the table (rebound to another unit on each page change)."""

    def __init__(self) -> None:
        self.unit: str | None = None
        self.pin = ipywidgets.Checkbox(value=False, indent=False,
                                       layout=ipywidgets.Layout(width="260px"))
        self.policy = ipywidgets.Dropdown(options=list(POLICIES), value="recompute",
                                          layout=ipywidgets.Layout(width="110px"))
        self.shard = ipywidgets.Dropdown(options=list(SHARD_LEVELS), value="none",
                                         tooltip="shard level over the unit's replicas",
                                         layout=ipywidgets.Layout(width="110px"))
        self.place = ipywidgets.Dropdown(options=list(OPTIMIZER_PLACES), value="device",
                                         tooltip="where the unit's optimizer states and step live",
                                         layout=ipywidgets.Layout(width="90px"))
        self.info = ipywidgets.HTML(layout=ipywidgets.Layout(width="300px"))
        self.box = ipywidgets.HBox([self.pin, self.policy, self.shard, self.place, self.info])

    @property
    def choices(self) -> list[ipywidgets.Dropdown]:
        """What a tick pins the unit to."""
        return [self.policy, self.shard, self.place]


class PinTable(ipywidgets.VBox):
    """Checkboxes that pin units of ``search`` to a memory policy; see the module docstring."""

    def __init__(self, search: Any, *, page_size: int = 12,
                 call: Callable[..., None] | None = None) -> None:
        self.search = search
        self._call = call or (lambda fn, *args: fn(*args))
        self.units = search.graph.units
        self.filter = ipywidgets.Text(placeholder="filter units by name", description="units",
                                      continuous_update=False)
        self.prev_page = ipywidgets.Button(description="◀", layout=ipywidgets.Layout(width="40px"))
        self.next_page = ipywidgets.Button(description="▶", layout=ipywidgets.Layout(width="40px"))
        self.page = ipywidgets.BoundedIntText(value=1, min=1, max=1, description="page",
                                              layout=ipywidgets.Layout(width="140px"))
        self.where = ipywidgets.HTML()
        self.status = ipywidgets.HTML()
        self.rows = [_Row() for _ in range(page_size)]
        self._binding = False     # True while rows are being refilled: their changes are not clicks
        self.precision = ipywidgets.Dropdown(
            options=[("search chooses", "")] + [(p, p) for p in PRECISIONS],
            description="precision", layout=ipywidgets.Layout(width="260px"))
        self.precision.observe(lambda ch: self._call(self._on_precision), names="value")
        for row in self.rows:
            row.pin.observe(lambda ch, r=row: self._call(self._on_pin, r), names="value")
            for choice in row.choices:
                choice.observe(lambda ch, r=row: self._call(self._on_choice, r), names="value")
        self.filter.observe(lambda ch: self.refresh(), names="value")
        self.page.observe(lambda ch: self.refresh(), names="value")
        self.prev_page.on_click(lambda b: self._turn(-1))
        self.next_page.on_click(lambda b: self._turn(+1))
        header = ipywidgets.HTML("<b>Pin units</b> (while paused): tick to pin a unit to the "
                                 "policy, shard level and optimizer place beside it; untick to "
                                 "let the search choose again.")
        nav = ipywidgets.HBox([self.filter, self.prev_page, self.page, self.next_page,
                               self.where])
        super().__init__([header, self.precision, nav, *(r.box for r in self.rows),
                          self.status])
        self.refresh()

    # ------------------------------------------------------------------ paging
    def matching(self) -> list[str]:
        """Units whose name contains the filter text, in execution order."""
        text = self.filter.value.strip().lower()
        return [u for u in self.units.index if text in u.lower()]

    def _turn(self, by: int) -> None:
        # BoundedIntText clamps to [1, pages]; its observer refreshes the rows.
        self.page.value = min(max(self.page.value + by, self.page.min), self.page.max)

    def refresh(self) -> None:
        """Refill the visible rows from the search (pins, best policies)."""
        names = self.matching()
        size = len(self.rows)
        self.page.max = max(1, -(-len(names) // size))   # clamps page.value (refreshing again)
        first = (self.page.value - 1) * size
        shown = names[first:first + size]
        pins = pinned_policies(self.search)
        configs = self.search.pin_configs
        best_s = self.search.best
        best = best_s.table.set_index("unit")["policy"]
        position = {u: i for i, u in enumerate(best_s.units)}
        self._binding = True
        try:
            self.precision.value = self.search.pinned_precision or ""
            for row, unit in zip(self.rows, shown + [None] * (size - len(shown))):
                row.unit = unit
                row.box.layout.display = None if unit else "none"
                if unit is None:
                    continue
                row.pin.description = unit
                row.pin.value = unit in pins
                row.policy.value = pins.get(unit, "recompute")
                i, pinned = position[unit], configs.get(unit, {})
                row.shard.value = pinned.get("shard", best_s.shard_levels[i])
                row.place.value = pinned.get("optimizer_place", OPTIMIZER_PLACES[
                    int(best_s.offload_optimizer[i])])
                saved = format_bytes(self.units.at[unit, "saved_bytes"])
                row.info.value = (f"<span style='color:#666'>{html.escape(self.units.at[unit, 'kind'])}"
                                  f", saves {saved}; best: {html.escape(str(best.get(unit, '?')))}"
                                  "</span>")
        finally:
            self._binding = False
        self.where.value = (f"{first + 1}–{first + len(shown)} of {len(names)}" if shown
                            else "no unit matches")

    # ------------------------------------------------------------------ pinning
    def set_enabled(self, enabled: bool) -> None:
        """Let a person edit the pins (only while the search is not running)."""
        self.precision.disabled = not enabled
        for row in self.rows:
            row.pin.disabled = not enabled
            for choice in row.choices:
                choice.disabled = not enabled

    def _apply(self, row: _Row) -> None:
        unit = row.unit
        try:
            if row.pin.value:
                self.search.pin([unit], policy=row.policy.value, config={
                    "shard": row.shard.value, "optimizer_place": row.place.value})
                self.status.value = (f"pinned <code>{html.escape(unit)}</code> to "
                                     f"{row.policy.value}, shard {row.shard.value}, optimizer "
                                     f"on the {row.place.value}")
            else:
                self.search.unpin([unit])
                self.status.value = f"unpinned <code>{html.escape(unit)}</code>"
        except Exception as exc:    # show why the search refused, and undo the tick
            self.status.value = (f"<span style='color:#d62728'>cannot pin "
                                 f"{html.escape(str(unit))}: {html.escape(str(exc))}</span>")
        self.refresh()

    def _on_pin(self, row: _Row) -> None:
        if not self._binding and row.unit is not None:
            self._apply(row)

    def _on_choice(self, row: _Row) -> None:
        if not self._binding and row.unit is not None and row.pin.value:
            self._apply(row)

    def _on_precision(self) -> None:
        if self._binding:
            return
        chosen = self.precision.value or None
        try:
            self.search.pin_precision(chosen)
            self.status.value = (f"pinned precision {chosen}" if chosen else
                                 "the search chooses the precision again")
        except Exception as exc:    # show why the search refused, and undo the choice
            self.status.value = (f"<span style='color:#d62728'>cannot pin precision "
                                 f"{html.escape(str(chosen))}: {html.escape(str(exc))}</span>")
        self.refresh()
