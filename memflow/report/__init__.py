"""The HTML report: one self-contained file (bokeh inline, no network) of a plan.

* :func:`write_report` — a report of a simulated step (and, when given, the graph, the search
  history and a baseline to compare with);
* :func:`write_plan_report` — the report of a folder written by ``memflow search``;
* the charts, shared with the Jupyter views of ``memflow_widgets``: :class:`MemoryChart`
  (memory over time per GPU, stacked by category, capacity lines), :class:`GanttChart`
  (compute streams and links), :class:`StrategyGraph`, :class:`ComparisonChart` and
  :class:`HistoryChart`; the model states per GPU and the settings that decide them
  (:func:`model_states_html`, :mod:`memflow.report.states`); colours and formats in
  :mod:`memflow.report.style`.

bokeh is needed here only; ``import memflow.report`` stays cheap and loads it on first use.
"""
from __future__ import annotations

from .._lazy import lazy_names

_EXPORTS = {
    "write_report": "memflow.report.page",
    "write_plan_report": "memflow.report.page",
    "report_html": "memflow.report.page",
    "MemoryChart": "memflow.report.memory",
    "GanttChart": "memflow.report.gantt",
    "StrategyGraph": "memflow.report.strategy",
    "ComparisonChart": "memflow.report.compare",
    "HistoryChart": "memflow.report.history",
    "model_states_html": "memflow.report.states",
    "model_states_table": "memflow.report.states",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_names("memflow.report", _EXPORTS)
