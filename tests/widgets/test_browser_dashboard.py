"""The dashboard in a real JupyterLab page, and in Voila, driven by headless Chromium.

Start → the iteration counter moves → Pause → tick two units → Resume → the counter moves
again, those units are recomputed in every strategy after the resume, and the memory chart of
the best strategy has drawn. Screenshots go to artifacts/dashboard.png and
artifacts/dashboard-voila.png.
"""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from browser import (canvas_ink, chromium, explained, jupyter_server,  # noqa: F401 (fixtures)
                     lab_page, open_notebook, run_all_cells, screenshot, wait_for_ink,
                     write_notebook)

pytestmark = pytest.mark.browser

HERE = Path(__file__).resolve().parent
PINNED = ["layer3", "layer7"]

SETUP = f"""
import json, os, sys
sys.path.insert(0, {str(HERE)!r})
import memflow
import memflow_widgets as mfw
from widget_helpers import Recording, chain_graph
mfw.setup()
graph = chain_graph(12, unit_bytes=2**28)
search = Recording(memflow.MCMCSearch(graph, memflow.Cluster.preset("2xV100-16GB"), seed=0))
PINNED = {PINNED!r}
"""

# The kernel reports what the page cannot show: after every flush and change of state, the
# policy of the would-be pinned units in every strategy the chain stood on so far, and which
# unit every proposal moved.
PROBE = """
def probe(runner):
    doc = {"state": runner.state, "pins": search.pins, "iteration": search.iteration,
           "chart": [int(i) for i in dash.progress_source.data["iteration"]],
           "policies": {u: [dict(zip(s.units, s.policies))[u] for s in search.strategies]
                        for u in PINNED},
           "moved": search.history["unit"].astype(str).tolist()}
    with open("probe.json.tmp", "w") as fh:
        json.dump(doc, fh)
    os.replace("probe.json.tmp", "probe.json")

dash = mfw.SearchDashboard(search)
dash.runner.add_listener(probe)
dash
"""


def button(page, name: str):
    # The accessible name of an ipywidgets button starts with its icon's glyph: match the end.
    return page.get_by_role("button", name=re.compile(rf"{name}$"))


def counter(page, name: str) -> str:
    return page.locator(f"[data-counter='{name}']").first.inner_text()


def wait_iteration_above(page, n: int) -> None:
    page.wait_for_function(
        """(n) => {
            const el = document.querySelector("[data-counter='iteration']");
            return el && parseInt(el.textContent.replace(/,/g, '')) > n;
        }""", arg=n, timeout=60_000)


def wait_state(page, state: str) -> None:
    page.wait_for_function(
        """(s) => {
            const el = document.querySelector("[data-counter='state']");
            return el && el.textContent === s;
        }""", arg=state, timeout=60_000)


_PAGE_CHART_JS = """() => window.Bokeh ? Bokeh.documents.flatMap(d => [...d._all_models.values()])
    .filter(m => m.data && m.data.best_cost).map(m => Array.from(m.data.iteration)) : []"""


def wait_chart_points(page, points: list[int]) -> None:
    """Wait until the page's cost chart holds exactly ``points`` (its data reached the page)."""
    try:
        page.wait_for_function(f"(want) => ({_PAGE_CHART_JS})().some(it => "
                               "it.length === want.length && it.every((v, i) => v === want[i]))",
                               arg=points, timeout=60_000)
    except Exception as exc:
        raise AssertionError(f"the page's chart holds {page.evaluate(_PAGE_CHART_JS)}, the "
                             f"kernel's {points}") from exc


def read_probe(path: Path, *, state: str, timeout: float = 30.0) -> dict:
    """The kernel's report once it says ``state`` (the page may show it a moment earlier)."""
    end = time.monotonic() + timeout
    while True:
        doc = json.loads(path.read_text()) if path.exists() else {}
        if doc.get("state") == state or time.monotonic() > end:
            assert doc.get("state") == state, f"the kernel's probe says {doc.get('state')!r}"
            return doc
        time.sleep(0.05)


def test_pause_pin_resume_in_jupyterlab(jupyter_server, lab_page):
    page = lab_page
    with explained(page, jupyter_server, "dashboard"):
        write_notebook(jupyter_server.root / "dashboard.ipynb", [SETUP, PROBE])
        open_notebook(page, jupyter_server, "dashboard.ipynb")
        run_all_cells(page)
        start = button(page, "Start")
        start.wait_for(timeout=90_000)
        start.click()
        wait_iteration_above(page, 30)

        button(page, "Pause").click()
        wait_state(page, "paused")
        paused_at = int(counter(page, "iteration").replace(",", ""))
        for unit in PINNED:
            page.get_by_label(unit, exact=True).check()
            page.get_by_text(f"pinned {unit} to recompute").wait_for()

        button(page, "Resume").click()
        wait_iteration_above(page, paused_at + 100)
        button(page, "Pause").click()
        wait_state(page, "paused")

        probe = read_probe(jupyter_server.root / "probe.json", state="paused")
        assert probe["pins"] == {u: "recompute" for u in PINNED}
        assert probe["iteration"] >= paused_at + 100
        for unit in PINNED:     # every strategy the chain stood on after the resume
            assert set(probe["policies"][unit][paused_at:]) == {"recompute"}, unit
        moved_after = probe["moved"][paused_at:]
        assert len(moved_after) >= 100 and not set(moved_after) & set(PINNED)
        # the kernel's chart holds one point per flush, ending at the pause (the page's echo of
        # each stream is not added twice), and the page's chart holds the same points
        chart = probe["chart"]
        assert chart[-1] == probe["iteration"] and chart == sorted(set(chart))
        wait_chart_points(page, chart)

        ink = wait_for_ink(page, ".memflow-memorytimeline", 5000)      # the stacked areas
        progress = canvas_ink(page, ".memflow-searchdashboard")
        assert progress["ink"] > ink["ink"] + 500, progress  # the cost and acceptance lines too
        page.set_viewport_size({"width": 1280, "height": 2000})   # the whole dashboard in view
        page.locator(".memflow-searchdashboard").scroll_into_view_if_needed()
        screenshot(page, "dashboard")


def test_dashboard_runs_in_voila(jupyter_server, lab_page):
    page = lab_page
    with explained(page, jupyter_server, "dashboard-voila"):
        write_notebook(jupyter_server.root / "voila.ipynb", [SETUP, PROBE])
        page.goto(jupyter_server.voila_url("voila.ipynb"))
        start = button(page, "Start")
        start.wait_for(timeout=120_000)       # Voila runs the notebook before it shows the page
        start.click()
        wait_iteration_above(page, 20)
        button(page, "Pause").click()
        wait_state(page, "paused")
        wait_for_ink(page, ".memflow-memorytimeline", 5000)
        screenshot(page, "dashboard-voila")
