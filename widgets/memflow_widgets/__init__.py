"""memflow_widgets: the Jupyter layer of memflow — live, pausable search and views of results.

Built from ipywidgets and bokeh (through jupyter_bokeh), it calls only memflow's public API and
holds no model state: every view keeps references to memflow objects and to widget and chart
models. Call :func:`setup` once per notebook so that charts draw offline.

In a notebook (each view displays itself as the last expression of a cell):

>>> import memflow
>>> import memflow_widgets as mfw
>>> from memflow.search.synthetic import chain_graph
>>> graph, cluster = chain_graph(6), memflow.Cluster.preset("2xV100-16GB")
>>> mfw.setup()                                              # doctest: +SKIP
>>> search = memflow.MCMCSearch(graph, cluster, seed=0)
>>> dash = mfw.SearchDashboard(search)     # Start, Pause, pin units, Resume, Export
>>> dash.runner.step(10)                   # what the Step button does
>>> search.iteration, list(dash.progress_source.data["iteration"])
(10, [0, 10])
>>> result = search.best_result
>>> views = [mfw.MemoryTimeline(result), mfw.Timeline(result), mfw.ModelStates(result),
...          mfw.StrategyView(graph, search.best), mfw.compare({"best": result})]

``SearchRunner`` is the widget-free part of the dashboard: it runs any search with ``step(n)``
on the notebook's event loop in short chunks (``start``, ``pause``, ``resume``).
"""
from .compare import Comparison, compare
from .dashboard import SearchDashboard
from .gantt import Timeline
from .memory import MemoryTimeline
from .render import setup
from .runner import SearchRunner
from .states import ModelStates
from .strategy_view import StrategyView

__all__ = ["setup", "MemoryTimeline", "Timeline", "ModelStates", "StrategyView", "compare",
           "Comparison", "SearchDashboard", "SearchRunner"]
