"""The report page: one self-contained HTML file of a plan (BokehJS inline, no network).

It shows the summary numbers; the plan against data parallel (step time, peak per GPU); memory
over time per GPU stacked by category with capacity lines; the Gantt chart of compute streams
and links; the strategy (a table of units, policy, degrees and devices, and the graph); and,
for a search, the cost and acceptance of every proposal.

>>> import tempfile, pathlib, memflow
>>> g = memflow.zoo.graph("chain", batch_size=8, n=3, width=16)
>>> cluster = memflow.Cluster.preset("2xV100-16GB")
>>> result = memflow.simulate(g, memflow.Strategy.data_parallel(g, cluster), cluster)
>>> path = write_report(pathlib.Path(tempfile.mkdtemp()) / "report.html", result, graph=g)
>>> text = path.read_text()
>>> "BEGIN bokeh.min.js" in text, "layers.2" in text, "<script src" in text
(True, True, False)
"""
from __future__ import annotations

import html
import logging
import os
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from .._jsonio import Fields, read_json, write_text
from ..errors import MemflowError, StrategyError
from .states import model_states_html
from .style import device_list, format_bytes, format_seconds

__all__ = ["report_html", "write_report", "write_plan_report", "static_components",
           "strategy_table", "STRATEGY_CAPTION"]

_CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1000px; color: #222; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
table.numbers td, table.numbers th, table.units td, table.units th {
  padding: 2px 10px; text-align: right; border-bottom: 1px solid #ddd; font-size: 0.9em; }
table.numbers th, table.units th { text-align: left; }
.fits { color: #2a7a2a; font-weight: bold; } .oom { color: #c33; font-weight: bold; }
p.note { color: #555; font-size: 0.9em; }
.memflow-chart { margin: 0.5em 0; }
"""


def strategy_table(strategy) -> pd.DataFrame:
    """:attr:`memflow.Strategy.table` for people: long device lists shortened, and ``—``
    where a field does not apply (no pipeline stage, no recompute segment, no error bound).

    >>> from memflow.strategy import Strategy
    >>> s = Strategy(["a", "b"], devices=[[f"gpu{i}" for i in range(8)]] * 2,
    ...              sample=[8, 8]).with_policy(recompute=["b"])
    >>> strategy_table(s)[["devices", "stage", "segment", "error_bound"]].values.tolist()
    [['gpu0…gpu7 (8)', '—', '—', '—'], ['gpu0…gpu7 (8)', '—', '0', '—']]
    """
    from .strategy import plan_cells

    table = strategy.table.copy()
    table["devices"] = table["devices"].map(device_list)
    for column in ("error_bound", "stage", "segment"):
        table[column] = [plan_cells({column: v})[0][1] for v in table[column]]
    return table


STRATEGY_CAPTION = (
    "policy: what a unit does with what it saves for backward; error_bound: the error bound "
    "of a compressed unit; segment_break: a new recompute segment starts here; sample, "
    "parameter, attribute: how the unit is split over its devices; stage: its pipeline "
    "stage; segment: its recompute segment (consecutive recomputed units run as one "
    "checkpoint); shard: what of its model states is split over its data-parallel replicas "
    "(none: DDP; optimizer: ZeRO-1; gradients: ZeRO-2; parameters: ZeRO-3, FSDP full shard); "
    "offload_optimizer: its optimizer state and step live on the host (ZeRO-Offload). — : "
    "does not apply (not compressed, no pipeline, not recomputed).")


def _fit(result) -> str:
    return ("<span class='fits'>fits</span>" if result.feasible else
            f"<span class='oom'>out of memory on {html.escape(', '.join(result.over_capacity))}"
            "</span>")


def _numbers(result, summary: Mapping[str, Any], baseline, cluster=None) -> str:
    worst = result.peak_memory.idxmax()
    rows = []
    for key, label in (("model", "model"), ("batch", "batch"), ("cluster_name", "cluster"),
                       ("units", "units")):
        if summary.get(key) is not None:
            rows.append((label, html.escape(str(summary[key]))))
    rows += [("strategy", html.escape(result.strategy.name)),
             ("step time", format_seconds(result.iteration_time)),
             ("throughput", f"{result.throughput:,.1f} samples/s"),
             ("largest peak", f"{format_bytes(result.peak_memory[worst])} of "
                              f"{format_bytes(result.capacity[worst])} ({html.escape(worst)})"),
             ("memory", _fit(result))]
    if cluster is not None:
        rows.append(("time figures", html.escape(cluster.figures_note(result.peak_memory.index))))
    if baseline is not None:
        rows.append(("data parallel", f"{format_seconds(baseline.iteration_time)}, "
                                      f"{_fit(baseline)}"))
    if summary.get("iterations"):
        rows.append(("search", f"{summary['iterations']:,} proposals in "
                               f"{summary.get('search_seconds', 0):,.1f} s, "
                               f"{summary.get('acceptance_rate') or 0:.0%} accepted"))
    cells = "".join(f"<tr><th>{k}</th><td style='text-align:left'>{v}</td></tr>"
                    for k, v in rows)
    return f"<table class='numbers'>{cells}</table>"


def static_components(roots: Mapping[str, Any]) -> tuple[str, dict[str, str]]:
    """bokeh's ``components(roots)``: one ``<script>`` and a ``<div>`` per root, for a page
    without Python behind it.

    >>> from bokeh.plotting import figure
    >>> script, divs = static_components({"a": figure()})
    >>> script.lstrip().startswith("<script") and list(divs)
    ['a']
    """
    from bokeh.embed import components

    # Python callbacks cannot run in a static page; bokeh's warning about them is noise here.
    log = logging.getLogger("bokeh.embed.util")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        return components(dict(roots))
    finally:
        log.setLevel(level)


def report_html(result, *, graph=None, history: pd.DataFrame | None = None, baseline=None,
                summary: Mapping[str, Any] | None = None, title: str | None = None,
                cluster=None) -> str:
    """The report of ``result`` (a :class:`~memflow.SimResult`) as one HTML page.

    ``graph`` adds the picture of the strategy over the units; ``history`` (a search's) the
    cost and acceptance charts; ``baseline`` (another SimResult, e.g. data parallel) the
    comparison; ``summary`` (``plan/summary.json``) the model, batch and search numbers;
    ``cluster`` (the result's) a line saying which time figures are datasheet and which
    measured or calibrated (its devices' ``figures`` column).
    """
    from bokeh.resources import INLINE

    from .compare import ComparisonChart
    from .gantt import GanttChart
    from .history import HistoryChart
    from .memory import MemoryChart
    from .strategy import StrategyGraph

    summary = dict(summary or {})
    model = summary.get("model") or (graph.meta.get("model") if graph is not None else None)
    title = title or f"memflow plan{': ' + str(model) if model else ''}"
    sections: list[tuple[str, str, Any]] = []   # (heading, html before the chart, chart)
    if baseline is not None:
        chart = ComparisonChart({"data parallel": baseline, "plan": result})
        sections.append(("The plan against data parallel", chart.summary_html(), chart))
    memory = MemoryChart(result, ncols=2, width=470)
    sections.append(("Memory over one step, per GPU", memory.summary_html(), memory))
    gantt = GanttChart(result)
    sections.append(("Compute streams and links", gantt.summary_html(), gantt))
    units = (strategy_table(result.strategy).to_html(index=False, classes="units", border=0)
             + f"<p class='note'>{html.escape(STRATEGY_CAPTION)}</p>")
    picture = (StrategyGraph(graph, result.strategy, colour_by="policy") if graph is not None
               else None)
    sections.append(("Model states per GPU", model_states_html(result), None))
    sections.append(("Strategy", f"<p class='note'>microbatches {result.strategy.microbatches} "
                     f"({html.escape(result.strategy.schedule)}) · precision "
                     f"{html.escape(result.precision)}</p>{units}", picture))
    if history is not None and len(history):
        chart = HistoryChart(history)
        sections.append(("Search", chart.summary_html(), chart))
    charts = {f"chart{i}": c.root for i, (_, _, c) in enumerate(sections) if c is not None}
    script, divs = static_components(charts)
    body = [f"<h1>{html.escape(title)}</h1>", _numbers(result, summary, baseline, cluster)]
    for i, (heading, text, chart) in enumerate(sections):
        body.append(f"<h2>{html.escape(heading)}</h2>{text}")
        if chart is not None:
            body.append(f"<div class='memflow-chart'>{divs[f'chart{i}']}</div>")
    return ("<!DOCTYPE html>\n<html lang='en'>\n<head>\n<meta charset='utf-8'>\n"
            f"<title>{html.escape(title)}</title>\n<style>{_CSS}</style>\n{INLINE.render()}\n"
            f"</head>\n<body>\n{''.join(body)}\n{script}\n</body>\n</html>\n")


def write_report(path: str | os.PathLike, result, **options: Any) -> Path:
    """Write :func:`report_html` of ``result`` to ``path`` (atomically); the path."""
    path = Path(path)
    if path.suffix.lower() not in (".html", ".htm"):
        raise MemflowError(f"the report must be an .html file; got {path.name!r}")
    return write_text(path, report_html(result, **options))


def _read_summary(path: Path) -> dict[str, Any]:
    """``summary.json`` (empty when absent), the fields the page shows type-checked."""
    if not path.is_file():
        return {}
    f = Fields(read_json(path, kind="memflow.planners"), str(path))
    f.int("iterations", least=0, default=None)
    f.number("search_seconds", least=0, default=0)
    f.number("acceptance_rate", least=0, nullable=True, default=0)
    for key in ("model", "cluster_name"):
        f.str(key, nullable=True, default=None)
    return f.doc


def write_plan_report(plan: str | os.PathLike, out: str | os.PathLike | None = None, *,
                      search=None) -> Path:
    """The report of a plan folder written by ``memflow search`` (``out`` defaults to
    ``plan/report.html``). The graph and cluster come from ``search.json`` (or ``search``,
    the :class:`~memflow.MCMCSearch` itself when at hand); the strategy from
    ``strategy.json``, so a hand-edited strategy is what the report shows."""
    from ..search import MCMCSearch
    from ..search.initial import data_parallel
    from ..sim import simulate
    from ..strategy import Strategy

    plan = Path(plan)
    if not plan.is_dir():
        raise MemflowError(f"{plan}: no such plan folder (write one with "
                           f"'memflow search ... --out {plan}')")
    if search is None:
        search = MCMCSearch.load(plan / "search.json")
    graph, cluster = search.graph, search.cluster
    strategy = Strategy.from_json(plan / "strategy.json")
    try:
        strategy.validate(graph, cluster)
    except StrategyError as exc:
        raise StrategyError(
            f"{plan / 'strategy.json'} does not fit the model of {plan / 'search.json'} "
            f"({graph.meta.get('model')}, {len(graph)} units, batch "
            f"{graph.meta.get('batch_size')}); the two files are from different runs: "
            f"{exc}") from None
    summary = _read_summary(plan / "summary.json")
    settings = {"optimizer": search.settings["optimizer"],
                "precision": search.settings["precision"]}
    result = simulate(graph, strategy, cluster, **settings)
    baseline = simulate(graph, data_parallel(graph, cluster), cluster, **settings)
    return write_report(plan / "report.html" if out is None else out, result, graph=graph,
                        history=search.history, baseline=baseline, summary=summary,
                        cluster=cluster)
