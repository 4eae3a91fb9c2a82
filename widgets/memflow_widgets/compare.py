"""compare(results): side-by-side bars of step time and per-GPU peak memory for several strategies.

The chart is :class:`memflow.report.ComparisonChart` (the HTML report compares its plan with
data parallel the same way), shown here as a widget.

>>> import memflow
>>> g = memflow.zoo.graph("chain", batch_size=8, n=3, width=16)
>>> cluster = memflow.Cluster.preset("2xV100-16GB")
>>> dp = memflow.simulate(g, memflow.Strategy.data_parallel(g, cluster), cluster)
>>> compare({"data parallel": dp}).summary_html().count("<tr>")
2
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from memflow.report.compare import ComparisonChart, compare_table

from .render import BokehView

__all__ = ["compare", "Comparison", "compare_table"]


class Comparison(ComparisonChart, BokehView):
    """Two charts: step time per strategy, and peak memory per GPU per strategy against each
    GPU's capacity (red: the strategy does not fit)."""

    def __init__(self, results: Mapping[str, Any] | Sequence[Any], **options: Any) -> None:
        ComparisonChart.__init__(self, results, **options)
        BokehView.__init__(self, self.root)


def compare(results: Mapping[str, Any] | Sequence[Any], **kwargs: Any) -> Comparison:
    """Compare simulated strategies: step time and per-GPU peak memory side by side.

    ``results`` maps a name to a :class:`memflow.SimResult` (or is a list of them, named by
    their position). Keyword arguments go to :class:`Comparison` (``width``, ``height``).
    """
    return Comparison(results, **kwargs)
