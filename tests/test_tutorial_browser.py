"""Lesson 1 of the classroom series in a real JupyterLab page, driven by headless Chromium.

The lesson is opened as a student would open it (outputs cleared, so nothing drawn comes from
the stored copy), every cell is run from the Run menu's command, and the test checks that every
code cell ran without an error and that the lesson's memory chart drew (colourful pixels in
its bokeh canvas). Screenshot: ``artifacts/tutorial-01.png``.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
import pytest

from browser import (KERNEL, canvas_ink, chromium, jupyter_server,  # noqa: F401 (fixtures)
                     lab_page, open_notebook, run_all_cells, screenshot, wait_for_ink)

pytestmark = pytest.mark.browser

TUTORIALS = Path(__file__).resolve().parents[1] / "tutorials"
LESSON = "01_where_memory_goes.ipynb"

# Per code cell of the open notebook: its execution count and the names of its errors.
_CELLS_JS = """() => {
    const nb = window.jupyterapp.shell.currentWidget;
    return nb.content.widgets.filter(c => c.model.type === 'code').map(c => ({
        count: c.model.executionCount,
        errors: c.model.outputs.toJSON().filter(o => o.output_type === 'error')
                 .map(o => o.ename + ': ' + o.evalue)}));
}"""

_DONE_JS = f"""() => {{
    const w = window.jupyterapp.shell.currentWidget;
    const kernel = w.sessionContext.session.kernel;
    return kernel.status === 'idle' && ({_CELLS_JS})().every(c => c.count);
}}"""


def student_view(lesson: str, root: Path) -> str:
    """Copy ``lesson`` (and the lessons' helper module) into ``root`` as a student opens it:
    outputs and saved widget state cleared, on the test server's kernel."""
    nb = nbformat.read(TUTORIALS / lesson, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nb.metadata.pop("widgets", None)
    nb.metadata["kernelspec"] = {"name": KERNEL, "display_name": "Python (memflow venv)",
                                 "language": "python"}
    nbformat.write(nb, root / lesson)
    shutil.copy(TUTORIALS / "_lesson.py", root / "_lesson.py")
    return lesson


def test_lesson_runs_and_draws_in_jupyterlab(jupyter_server, lab_page):
    page = lab_page
    lesson = student_view(LESSON, jupyter_server.root)
    try:
        open_notebook(page, jupyter_server, lesson)
        assert canvas_ink(page, ".jp-Notebook")["ink"] == 0    # nothing drawn before running
        run_all_cells(page)
        page.wait_for_function(_DONE_JS, timeout=90_000)
        cells = page.evaluate(_CELLS_JS)
        failed = [(i, c["errors"]) for i, c in enumerate(cells) if c["errors"]]
        assert not failed, f"code cells that raised (index, error): {failed}"
        ink = wait_for_ink(page, ".memflow-memorytimeline", 2000)
        assert ink["canvases"] >= 1, ink
        page.locator(".memflow-memorytimeline").scroll_into_view_if_needed()
    except Exception as exc:
        shot = screenshot(page, "tutorial-01-failed")
        raise AssertionError(f"{exc}\n--- screenshot: {shot}\n--- server log:\n"
                             f"{jupyter_server.log_tail()}") from exc
    screenshot(page, "tutorial-01")
