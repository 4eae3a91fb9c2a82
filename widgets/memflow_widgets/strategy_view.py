"""StrategyView: the graph of units, coloured by device or by memory policy, sized by memory.

The picture is :class:`memflow.report.StrategyGraph` (the HTML report shows the same one); the
view adds a toggle between colourings and shows a unit's numbers when it is clicked.

>>> import memflow
>>> g = memflow.zoo.graph("chain", batch_size=8, n=3, width=16, units="blocks")
>>> view = StrategyView(g, memflow.Strategy.single_device(g))
>>> view.select("layers.1")
>>> "<b>layers.1</b>" in view.details.value
True
"""
from __future__ import annotations

from typing import Any

import ipywidgets

from memflow.report.strategy import ColourBy, StrategyGraph, layout_positions, unit_frame

from .render import BokehView

__all__ = ["StrategyView", "layout_positions", "unit_frame"]

_PROMPT = "<i>click a unit for its numbers</i>"


class StrategyView(StrategyGraph, BokehView):
    """The units of ``graph`` placed and coloured by ``strategy``; click one for its numbers.

    ``colour_by`` (a ToggleButtons, ``"device"`` or ``"policy"``) recolours the nodes;
    :meth:`select` does what a click does. Keyword options (``layout``, ``wrap``, ``width``,
    ``height``) are :class:`~memflow.report.StrategyGraph`'s.
    """

    def __init__(self, graph: Any, strategy: Any, *, colour_by: ColourBy = "device",
                 **options: Any) -> None:
        StrategyGraph.__init__(self, graph, strategy, colour_by=colour_by, **options)
        self.colour_by = ipywidgets.ToggleButtons(options=["device", "policy"], value=colour_by,
                                                  description="colour by")
        self.colour_by.observe(self._recolour, names="value")
        self.details = ipywidgets.HTML(_PROMPT)
        self.source.selected.on_change("indices", self._on_select)
        BokehView.__init__(self, self.root, (self.colour_by, self.details))

    def _recolour(self, change: dict[str, Any]) -> None:
        self.recolour(change["new"])

    def select(self, unit: str) -> None:
        """Select ``unit`` as a click on it would, and show its numbers."""
        names = list(self.source.data["unit"])
        if unit not in names:
            raise ValueError(f"StrategyView.select: {unit!r} is not a unit of this graph")
        self.source.selected.indices = [names.index(unit)]

    def _on_select(self, attr: str, old: list[int], new: list[int]) -> None:
        self.details.value = (self.details_html(str(self.source.data["unit"][new[0]]))
                              if new else _PROMPT)
