"""The report in a real browser: opened from disk (file://, no server, no network), every bokeh
plot draws a canvas that is not one flat colour; a screenshot is kept under artifacts/."""
from __future__ import annotations

import pytest

from browser import chromium, lab_page, screenshot, wait_for_ink  # noqa: F401  (fixtures)
from memflow.report import write_plan_report

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
    screenshot(lab_page, "report")
    # comparison (2), memory (legend strip + 2 GPUs), Gantt, strategy graph, search (2)
    assert len(plots) == 9, plots
    assert all(p["canvases"] >= 1 and p["colours"] >= 3 for p in plots), plots
    assert not errors, errors
