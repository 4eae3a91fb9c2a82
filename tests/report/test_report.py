"""The HTML report: self-contained (BokehJS inline, nothing fetched), carrying every chart's data."""
import json
import re

import numpy as np
import pandas as pd
import pytest

import memflow
from memflow.errors import MemflowError
from memflow.report import HistoryChart, write_plan_report, write_report
from memflow.report.page import report_html


def _embedded_docs(text: str) -> dict:
    """The bokeh documents the page embeds (the JSON bokeh's script carries)."""
    return json.loads(re.search(r"const docs_json = '(.*?)';\n", text).group(1))


def test_plan_report_is_self_contained(plan):
    path = write_plan_report(plan)
    assert path == plan / "report.html"
    text = path.read_text()
    assert "BEGIN bokeh.min.js" in text and "Bokeh.embed.embed_items" in text
    assert "<script src" not in text and "<link " not in text     # nothing fetched
    docs = _embedded_docs(text)
    roots = [r for d in docs.values() for r in d["roots"]]
    assert len(roots) == 5      # comparison, memory, Gantt, strategy graph, search
    for heading in ("The plan against data parallel", "Memory over one step, per GPU",
                    "Compute streams and links", "Strategy", "Search"):
        assert f"<h2>{heading}</h2>" in text


def test_report_numbers_and_data(plan, graph):
    text = (write_plan_report(plan, plan / "r.html")).read_text()
    best = memflow.Strategy.from_json(plan / "strategy.json")
    assert "chain" in text and "100 proposals" in text
    assert "out of memory on gpu0, gpu1" in text               # data parallel does not fit 4 MB
    for unit in graph.names:                                   # the strategy table
        assert f"<td>{unit}</td>" in text
    assert best.policies[0] in text
    assert "peak_memory" not in text and "gpu0: peak" in text   # memory chart titles


def test_report_follows_an_edited_strategy(plan, graph, cluster, tmp_path):
    edited = tmp_path / "plan"
    edited.mkdir()
    for name in ("search.json", "summary.json"):
        (edited / name).write_text((plan / name).read_text())
    memflow.Strategy.single_device(graph).with_policy(
        recompute=graph.names[:2]).to_json(edited / "strategy.json")
    text = write_plan_report(edited).read_text()
    assert "single device" in text and "recompute" in text


def test_report_of_a_result_alone(graph, tmp_path):
    cluster = memflow.Cluster.preset("1xV100-16GB")
    result = memflow.simulate(graph, memflow.Strategy.single_device(graph), cluster)
    text = report_html(result, title="one GPU")
    assert "<h1>one GPU</h1>" in text and "<h2>Search</h2>" not in text
    assert "<h2>The plan against data parallel</h2>" not in text
    with pytest.raises(MemflowError, match="must be an .html file"):
        write_report(tmp_path / "r.txt", result)


def test_missing_plan_folder_is_named(tmp_path):
    with pytest.raises(MemflowError, match="no such plan folder"):
        write_plan_report(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(MemflowError, match="search.json: no such file"):
        write_plan_report(tmp_path / "empty")


def test_a_long_history_is_thinned_but_keeps_every_improvement():
    n = 50_000
    rng = np.random.default_rng(0)
    cost = rng.uniform(1.0, 2.0, n)
    best = np.minimum.accumulate(cost)
    history = pd.DataFrame({"iteration": np.arange(n), "cost": cost, "best_cost": best,
                            "feasible": True, "accepted": rng.random(n) < 0.3})
    chart = HistoryChart(history, max_points=1000, window=100)
    drawn = np.asarray(chart.cost_source.data["iteration"])
    improvements = np.flatnonzero(np.r_[True, best[1:] != best[:-1]])
    assert len(drawn) <= 1000 + len(improvements) + 1
    assert set(improvements) <= set(drawn.tolist()) and drawn[-1] == n - 1
    # the best-so-far step line has one point per improvement plus the end
    assert list(chart.best_source.data["iteration"]) == sorted({*improvements, n - 1})
    # acceptance rates are over every proposal, sampled where drawn
    full_rate = pd.Series(history["accepted"].astype(float)).rolling(100, min_periods=1).mean()
    assert np.allclose(chart.acceptance_source.data["rate"], full_rate.to_numpy()[drawn])
    assert "50,000 proposals" in chart.summary_html()


def test_each_strategy_has_one_colour_in_both_comparison_charts(plan):
    from memflow.report import ComparisonChart
    from memflow.report.compare import STRATEGY_PALETTE

    search = memflow.MCMCSearch.load(plan / "search.json")
    best = search.best_result
    dp = memflow.simulate(search.graph, memflow.Strategy.data_parallel(search.graph,
                                                                       search.cluster),
                          search.cluster)
    chart = ComparisonChart({"data parallel": dp, "plan": best})
    time, peak = chart.time_source.data, chart.peak_source.data
    for name, colour in zip(time["strategy"], time["color"]):
        assert {c for s, c in zip(peak["strategy"], peak["color"]) if s == name} == {colour}
    assert "#d62728" not in STRATEGY_PALETTE          # red only marks what does not fit
    assert list(time["hatch"]) == ["x", " "] and list(peak["hatch"]) == ["x", " ", "x", " "]


def test_strategy_labels_never_overlap_and_stay_inside():
    from memflow.report.strategy import StrategyGraph, label_offsets

    rng = np.random.default_rng(1)
    for _ in range(20):                     # labels placed by label_offsets never overlap
        xy = rng.uniform(0, 400, (30, 2))
        sizes, widths = rng.uniform(8, 36, 30), rng.uniform(20, 80, 30)
        dy = label_offsets(xy, sizes, widths)
        shown = np.flatnonzero(np.isfinite(dy))
        for i in shown:
            for j in shown[shown > i]:
                assert (abs(xy[i, 0] - xy[j, 0]) >= (widths[i] + widths[j]) / 2
                        or abs(xy[i, 1] + dy[i] - xy[j, 1] - dy[j]) >= 9.33 + 2)
    g = memflow.zoo.graph("chain", batch_size=8, n=24, width=16, units="blocks")
    view = StrategyGraph(g, memflow.Strategy.single_device(g))
    assert list(view.source.data["label"]) == list(g.names)      # every name fits
    x, xr = np.asarray(view.source.data["x"]), view.figure.x_range
    assert xr.start < x.min() - 0.3 and xr.end > x.max() + 0.3    # room for the end labels
    assert "node area grows with the memory" in view.figure.below[-1].text
    g = memflow.zoo.graph("resnet50", batch_size=8)               # 175 units: some by hover
    view = StrategyGraph(g, memflow.Strategy.single_device(g))
    assert "" in set(view.source.data["label"]) and "hover" in view.figure.below[-1].text


def test_legends_say_what_the_marks_are(plan, graph):
    from memflow.report import MemoryChart
    from memflow.report.style import legend_columns

    search = memflow.MCMCSearch.load(plan / "search.json")
    chart = HistoryChart(search.history)
    labels = [item.label for item in chart.cost_figure.legend[0].items]
    # one entry per kind of proposal (grouped by "state" in the browser), one for the best
    assert [getattr(lb, "field", None) or lb.value for lb in labels] == ["state", "best so far"]
    best = [r for r in chart.cost_figure.renderers if r.data_source is chart.best_source]
    assert best and max(r.glyph.line_width for r in best if hasattr(r.glyph, "mode")) >= 3
    one = memflow.Cluster.preset("1xV100-16GB")
    result = memflow.simulate(graph, memflow.Strategy.single_device(graph), one)
    strip = MemoryChart(result, width=400).root.children[0]      # tutorial 1's chart
    legend = strip.legend[0]
    assert legend.ncols == legend_columns([i.label.value for i in legend.items], 400, 12) < 7
    rows = -(-len(legend.items) // legend.ncols)
    assert strip.height >= 20 + 23 * rows


def test_strategy_table_says_what_does_not_apply(plan):
    text = write_plan_report(plan, plan / "t.html").read_text()
    assert "<td>-1</td>" not in text and "<td>—</td>" in text
    assert "does not apply" in text and "node area grows" in text


def test_report_shows_model_states_and_the_settings_behind_them(graph):
    """Per-GPU weights, gradients and optimizer bytes (SimResult.model_states), the precision,
    optimizer, shard levels and optimizer placement appear in the report."""
    from memflow.report.states import model_states_table

    two = memflow.Cluster.preset("2xV100-16GB")
    s = memflow.Strategy.data_parallel(graph, two, shard="gradients", precision="bf16")
    result = memflow.simulate(graph, s, two, optimizer="adam")
    table = model_states_table(result)
    assert table["devices"].tolist() == ["gpu0,gpu1"]       # both hold the same: one row
    ms = result.model_states.iloc[0]
    assert table.iloc[0][["weights", "gradients", "optimizer"]].tolist() == ms.tolist()
    assert table.iloc[0]["total"] == ms.sum()
    text = report_html(result, graph=graph)
    assert "<h2>Model states per GPU</h2>" in text
    assert "precision bf16 · optimizer adam" in text and "gradients (ZeRO-2)" in text
    assert "<th>shard</th>" in text and "<th>offload_optimizer</th>" in text
    assert "ZeRO-Offload" in text        # the strategy table's caption says what they mean
