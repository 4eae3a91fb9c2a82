"""MemoryTimeline: memory over one simulated step, per device, stacked by category, as a view.

The chart is :class:`memflow.report.MemoryChart` — the HTML report draws the same one — shown
here as a live widget that the search dashboard redraws (:meth:`~MemoryChart.update`) as the
best strategy improves.

>>> import memflow
>>> g = memflow.zoo.graph("mlp", batch_size=4)
>>> one = memflow.Cluster.preset("1xV100-16GB")
>>> view = MemoryTimeline(memflow.simulate(g, memflow.Strategy.single_device(g), one))
>>> list(view.sources)
['gpu0']
"""
from __future__ import annotations

from typing import Any

from memflow.report.memory import MemoryChart, categories_of, memory_steps

from .render import BokehView

__all__ = ["MemoryTimeline", "memory_steps", "categories_of"]


class MemoryTimeline(MemoryChart, BokehView):
    """Memory over time on every device of a simulated step (a :class:`memflow.SimResult`),
    stacked by category, with capacity lines and a hover naming the running task; keyword
    options (``devices``, ``max_points``, ``width``, ``height``, ``ncols``) are
    :class:`~memflow.report.MemoryChart`'s."""

    def __init__(self, result: Any, **options: Any) -> None:
        MemoryChart.__init__(self, result, **options)
        BokehView.__init__(self, self.root)
