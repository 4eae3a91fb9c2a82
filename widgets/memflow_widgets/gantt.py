"""Timeline: a Gantt chart of one simulated step — every compute stream and link, every task.

The chart is :class:`memflow.report.GanttChart` (the HTML report draws the same one), shown
here as a widget: hover a bar for its task, click a legend entry to hide a kind.

>>> import memflow
>>> g = memflow.zoo.graph("chain", batch_size=8, n=3, width=16)
>>> cluster = memflow.Cluster.preset("2xV100-16GB")
>>> view = Timeline(memflow.simulate(g, memflow.Strategy.data_parallel(g, cluster), cluster))
>>> sorted(view.sources)
['allreduce', 'backward', 'forward', 'optimizer']
"""
from __future__ import annotations

from typing import Any

from memflow.report.gantt import GanttChart, busy_table, resource_order

from .render import BokehView

__all__ = ["Timeline", "resource_order", "busy_table"]


class Timeline(GanttChart, BokehView):
    """Gantt chart of the compute streams and links of a :class:`memflow.SimResult`; keyword
    options (``width``, ``row_height``) are :class:`~memflow.report.GanttChart`'s."""

    def __init__(self, result: Any, **options: Any) -> None:
        GanttChart.__init__(self, result, **options)
        BokehView.__init__(self, self.root)
