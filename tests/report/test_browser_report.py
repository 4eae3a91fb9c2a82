"""The report in a real browser: opened from disk (file://, no server, no network), every bokeh
plot draws a canvas that is not one flat colour, and every legend is there and whole; a
screenshot is kept under artifacts/."""
from __future__ import annotations

import pytest
from bokeh.resources import INLINE

import memflow
from browser import chromium, lab_page, screenshot, wait_for_ink  # noqa: F401  (fixtures)
from memflow.report import MemoryChart, write_plan_report
from memflow.report.page import static_components

pytestmark = pytest.mark.browser

# For each bokeh plot (a bk-Figure element, inside shadow roots), the number of distinct
# colours in its canvases: an empty plot is one colour (or none).
_PLOT_COLOURS_JS = """() => {
    const plots = [];
    const walk = (node, plot) => {
        if (!node) return;
        if (node.classList && node.classList.contains('bk-Figure')) {
            plot = {colours: new Set(), canvases: 0};
            plots.push(plot);
        }
        if (node.tagName === 'CANVAS' && plot && node.width && node.height) {
            plot.canvases++;
            const px = node.getContext('2d').getImageData(0, 0, node.width, node.height).data;
            for (let i = 0; i < px.length; i += 16)
                if (px[i + 3] > 0) plot.colours.add((px[i] << 16) | (px[i + 1] << 8) | px[i + 2]);
        }
        if (node.shadowRoot) walk(node.shadowRoot, plot);
        for (const child of node.children || []) walk(child, plot);
    };
    walk(document.body, null);
    return plots.map(p => ({canvases: p.canvases, colours: p.colours.size}));
}"""


# Every bokeh legend drawn (bokeh 3.9 draws them as DOM elements): its entries' texts and
# whether its box lies inside the plot that holds it (a clipped legend pokes out).
_LEGENDS_JS = """() => {
    const out = [], seen = new Set();
    const walk = (v) => {
        if (!v || seen.has(v)) return;
        seen.add(v);
        if (v.model && v.model.type === 'Legend') {
            const box = v.el.getBoundingClientRect(), plot = v.parent.el.getBoundingClientRect();
            out.push({plot: v.parent.model.title ? v.parent.model.title.text : '',
                      labels: v.entries.map(e => e.label_el.textContent),
                      inside: box.left >= plot.left - 0.5 && box.right <= plot.right + 0.5 &&
                              box.top >= plot.top - 0.5 && box.bottom <= plot.bottom + 0.5,
                      box: [box.left, box.top, box.right, box.bottom],
                      of: [plot.left, plot.top, plot.right, plot.bottom]});
        }
        for (const c of (v.child_views || [])) walk(c);
        if (v.renderer_views) for (const c of v.renderer_views.values()) walk(c);
    };
    for (const root of Object.values(Bokeh.index)) walk(root);
    return out;
}"""


def test_every_plot_of_the_report_draws(plan, lab_page):
    report = write_plan_report(plan)
    errors: list[str] = []
    lab_page.on("pageerror", lambda e: errors.append(str(e)))
    lab_page.on("request", lambda r: errors.append(f"fetched {r.url}")
                if not r.url.startswith(("file:", "data:", "blob:")) else None)
    lab_page.goto(report.as_uri())
    lab_page.wait_for_function("() => window.Bokeh && Bokeh.documents.length == 1 && "
                               "Bokeh.documents[0].roots().length == 5", timeout=60_000)
    wait_for_ink(lab_page, "body", 20_000)
    plots = lab_page.evaluate(_PLOT_COLOURS_JS)
    legends = {tuple(leg["labels"]): leg for leg in lab_page.evaluate(_LEGENDS_JS)}
    screenshot(lab_page, "report")
    # comparison (2), memory (legend strip + 2 GPUs), Gantt, strategy graph, search (2)
    assert len(plots) == 9, plots
    assert all(p["canvases"] >= 1 and p["colours"] >= 3 for p in plots), plots
    assert not errors, errors
    # memory categories, Gantt kinds, policies of the graph, kinds of proposal + best so far
    assert len(legends) == 4 and all(leg["inside"] for leg in legends.values()), legends
    cost = next(labels for labels in legends if "best so far" in labels)
    assert {"accepted, fits", "rejected, OOM"} <= set(cost), cost
    assert next(labels for labels in legends if "capacity" in labels)[0] == "weights"


def test_a_one_gpu_memory_legend_is_whole(graph, lab_page, tmp_path):
    """Tutorial 1's chart: one GPU, 400 px wide; its seven legend entries wrap, not clip."""
    one = memflow.Cluster.preset("1xV100-16GB")
    chart = MemoryChart(memflow.simulate(graph, memflow.Strategy.single_device(graph), one))
    script, divs = static_components({"m": chart.root})
    page = tmp_path / "memory.html"
    page.write_text(f"<html><head>{INLINE.render()}</head><body>{divs['m']}{script}"
                    "</body></html>")
    lab_page.goto(page.as_uri())
    lab_page.wait_for_function("() => window.Bokeh && Bokeh.documents.length == 1",
                               timeout=60_000)
    wait_for_ink(lab_page, "body", 2_000)
    legends = lab_page.evaluate(_LEGENDS_JS)
    screenshot(lab_page, "memory-one-gpu")
    assert len(legends) == 1 and legends[0]["inside"], legends
    assert legends[0]["labels"][-1] == "capacity" and len(legends[0]["labels"]) == 7
