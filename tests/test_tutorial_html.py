"""Lessons as static HTML (``jupyter nbconvert --to html`` with memflow_widgets' OfflineCharts
preprocessor) draw their charts offline: every chart each lesson stores, opened in headless
Chromium from a file with every network request refused, paints colourful pixels.

The lessons are converted as stored (executed, outputs kept), as a teacher would publish them:
all of them in one nbconvert run, and all pages opened in one browser (the module's): about a
minute for the series (63 s at a load of 5). Screenshots:
``artifacts/tutorial-html-<lesson>.png``.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from browser import canvas_ink, chromium, lab_page, screenshot  # noqa: F401 (fixtures)

ROOT = Path(__file__).resolve().parents[1]
TUTORIALS = ROOT / "tutorials"
sys.path.insert(0, str(TUTORIALS))
from _lesson import LESSONS  # noqa: E402

PREPROCESSOR = "memflow_widgets.offline.OfflineCharts"
# What one chart's output carries: a view's widget (its static fallback is what the page shows)
# or bokeh's own notebook embed (bokeh.io.show).
CHART_MIMES = ("application/vnd.jupyter.widget-view+json", "application/vnd.bokehjs_exec.v0+json")

_ROOTS_JS = """() => Array.from(document.querySelectorAll('[data-root-id]'))
                        .map(e => e.getAttribute('data-root-id'))"""


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict[str, Path]:
    """Every stored lesson as a static page: ``jupyter nbconvert --to html`` with the offline
    preprocessor, one run for all lessons. Lesson file name -> its page."""
    out = tmp_path_factory.mktemp("html")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), str(ROOT / "widgets"), os.environ.get("PYTHONPATH", "")]))
    subprocess.run([sys.executable, "-m", "nbconvert", "--to", "html", "--output-dir", str(out),
                    f"--HTMLExporter.preprocessors={PREPROCESSOR}",
                    *(str(TUTORIALS / lesson) for lesson in LESSONS)],
                   check=True, env=env, capture_output=True, timeout=600)
    return {lesson: out / lesson.replace(".ipynb", ".html") for lesson in LESSONS}


WIDGET_VIEW, BOKEH_EXEC = CHART_MIMES


def charts_stored(lesson: str) -> int:
    """The charts a lesson's page must draw: bokeh's own embeds, and the views whose static
    fallback embeds a bokeh document (a view of text alone, ModelStates, draws none)."""
    nb = nbformat.read(TUTORIALS / lesson, as_version=4)
    outs = [out.get("data", {}) for cell in nb.cells if cell.cell_type == "code"
            for out in cell.outputs]
    no_fallback = [d.get("text/plain", "")[:40] for d in outs
                   if WIDGET_VIEW in d and "text/html" not in d]
    assert not no_fallback, f"{lesson}: views a static page would show blank: {no_fallback}"
    return sum(BOKEH_EXEC in d or (WIDGET_VIEW in d and "data-root-id" in d["text/html"])
               for d in outs)


def test_static_html_loads_nothing_from_the_network(pages):
    for lesson, page in pages.items():
        html = page.read_text()
        for cdn in ("cdn.bokeh.org", "unpkg.com", "jupyter-widgets/html-manager"):
            assert cdn not in html, f"{lesson}: the page still loads {cdn}"
        assert "Bokeh" in html and html.count("data-root-id") >= charts_stored(lesson), lesson


@pytest.mark.browser
@pytest.mark.parametrize("lesson", LESSONS)
def test_static_html_draws_every_chart_offline(pages, lab_page, lesson):
    page = lab_page
    path = pages[lesson]
    refused: list[str] = []

    def offline(route):
        if route.request.url.startswith("file:"):
            route.continue_()
        else:                   # no network: a CDN script, MathJax, require.js... all refused
            refused.append(route.request.url)
            route.abort()

    page.route("**/*", offline)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)[:300]))
    page.goto(path.as_uri(), wait_until="load")
    expected = charts_stored(lesson)
    assert expected >= 1, f"{lesson} stores no chart"
    try:
        page.wait_for_function(f"() => ({_ROOTS_JS})().length >= {expected}", timeout=30_000)
        roots = page.evaluate(_ROOTS_JS)
        # bokeh paints a few frames after embedding: wait until every chart has ink
        page.wait_for_function(
            """(roots) => roots.every(r => {
                   const probe = document.querySelector(`[data-root-id="${r}"]`);
                   const walk = (n, acc) => { if (!n) return acc;
                       if (n.tagName === 'CANVAS') acc.push(n);
                       if (n.shadowRoot) walk(n.shadowRoot, acc);
                       for (const c of n.children || []) walk(c, acc); return acc; };
                   return walk(probe, []).length > 0; })""", arg=roots, timeout=30_000)
        page.wait_for_timeout(500)
        inks = {r: canvas_ink(page, f'[data-root-id="{r}"]') for r in roots}
        blank = {r: ink for r, ink in inks.items() if ink["ink"] < 500}
        assert not blank, f"{lesson}: charts that drew nothing offline: {blank}"
        assert not errors, f"{lesson}: page errors: {errors}"
    except Exception as exc:
        shot = screenshot(page, f"tutorial-html-{lesson[:-6]}-failed")
        raise AssertionError(f"{exc}\n--- screenshot: {shot}\n--- refused: {refused}") from exc
    screenshot(page, f"tutorial-html-{lesson[:-6]}")
