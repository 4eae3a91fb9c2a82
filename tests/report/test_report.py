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
    assert "chain" in text and "60 proposals" in text
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
