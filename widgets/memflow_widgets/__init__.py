"""memflow_widgets: the Jupyter layer of memflow — live, pausable search and views of results.

Built from ipywidgets and bokeh (through jupyter_bokeh), it calls only memflow's public API and
holds no model state: every view keeps references to memflow objects and to widget and chart
models. Call :func:`setup` once per notebook so that charts draw offline.

>>> import memflow_widgets as mfw
>>> sorted(mfw.__all__)  # doctest: +NORMALIZE_WHITESPACE
['Comparison', 'MemoryTimeline', 'SearchDashboard', 'SearchRunner', 'StrategyView',
 'Timeline', 'compare', 'setup']
"""
from .compare import Comparison, compare
from .dashboard import SearchDashboard
from .gantt import Timeline
from .memory import MemoryTimeline
from .render import setup
from .runner import SearchRunner
from .strategy_view import StrategyView

__all__ = ["setup", "MemoryTimeline", "Timeline", "StrategyView", "compare", "Comparison",
           "SearchDashboard", "SearchRunner"]
