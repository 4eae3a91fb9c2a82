"""The student copies of the lessons (``tutorials/_lesson.py --student``): every exercise is
blanked, its check fails with its hint (an ``AssertionError`` with a message, never a
``TypeError`` or a planner's error) until it is answered, and the copy's instructions name what
its cells show. Every lesson has a *predict* exercise and an *explain why* question answered,
for the teacher only, in a model answer.

The structural tests read every lesson (fast). The executed test (``slow``) runs each lesson's
student copy once, every exercise blank: each check must fail with its hint (an
``AssertionError`` with a message), and no other cell may fail. That the checks pass with the
reference answers is nbval's part (the lessons themselves run under ``--nbval-lax``).
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat
import pytest

TUTORIALS = Path(__file__).resolve().parents[1] / "tutorials"
sys.path.insert(0, str(TUTORIALS))
from _lesson import LESSONS, MODEL_ANSWER, blank_answers, student_copy  # noqa: E402

def exercises(nb) -> list[tuple[int, int]]:
    """``(your turn cell, check cell)`` indices: a code cell with reference answers and the
    next code cell."""
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    return [(i, j) for i, j in zip(code, code[1:])
            if blank_answers(nb.cells[i].source) != nb.cells[i].source]


def test_lesson_list():
    assert LESSONS == sorted(p.name for p in TUTORIALS.glob("[0-9][0-9]_*.ipynb"))
    assert len(LESSONS) >= 8


@pytest.mark.parametrize("lesson", LESSONS)
def test_every_exercise_has_a_check(lesson):
    nb = nbformat.read(TUTORIALS / lesson, as_version=4)
    pairs = exercises(nb)
    assert len(pairs) >= 3, f"{lesson}: {len(pairs)} exercises"
    for turn, check in pairs:
        assert nb.cells[turn].source.startswith("# your turn"), (lesson, turn)
        source = nb.cells[check].source
        assert source.startswith("# check") and "assert " in source, (lesson, check)
        assert "reference answer" not in blank_answers(nb.cells[turn].source)


@pytest.mark.parametrize("lesson", LESSONS)
def test_every_lesson_asks_to_predict_and_to_explain(lesson):
    nb = nbformat.read(TUTORIALS / lesson, as_version=4)
    turns = [nb.cells[turn].source for turn, _ in exercises(nb)]
    assert any(t.startswith("# your turn — predict") for t in turns), \
        f"{lesson}: no 'predict before you run' exercise"
    cells = nb.cells
    explain = [i for i, c in enumerate(cells)
               if c.cell_type == "markdown" and "**Explain why" in c.source]
    assert explain, f"{lesson}: no 'explain why' question"
    for i in explain:
        answer = cells[i + 1] if i + 1 < len(cells) else None
        assert answer is not None and answer.cell_type == "markdown" and \
            answer.source.startswith(MODEL_ANSWER), f"{lesson}: cell {i} has no model answer"
    assert sum(c.source.startswith(MODEL_ANSWER) for c in cells if c.cell_type == "markdown") \
        == len(explain)
    setup = next(c.source for c in cells if c.cell_type == "code")
    assert "show_hints()" in setup, f"{lesson}: failed checks would show tracebacks"


@pytest.mark.parametrize("lesson", LESSONS)
def test_student_copy_says_what_it_shows(tmp_path, lesson):
    """The copy's instructions name the answer marker its cells show, and the teacher's model
    answers are not in it."""
    [path] = student_copy(tmp_path, [lesson])
    nb = nbformat.read(path, as_version=4)
    text = "\n".join(c.source for c in nb.cells)
    assert "reference answer" not in text, f"{lesson}: the copy mentions reference answers"
    assert MODEL_ANSWER not in text and "Model answer" not in text
    intro = [c.source for c in nb.cells if c.cell_type == "markdown" and "`# your answer`" in c.source]
    assert intro, f"{lesson}: the copy never says which line to edit"
    shown = {m.group(1) for c in nb.cells if c.cell_type == "code"
             for m in re.finditer(r"#\s*(\w+) answer\s*$", c.source, re.M)}
    assert shown == {"your"}, shown


def test_student_copy_of_a_lesson_named_by_its_path(tmp_path):
    """``_lesson.py --student OUT tutorials/02_...ipynb`` writes OUT/02_...ipynb and leaves the
    lesson alone (a path once made the copy overwrite the lesson itself)."""
    lesson = TUTORIALS / LESSONS[-1]
    before = lesson.read_bytes()
    [path] = student_copy(tmp_path / "out", [str(lesson)])
    assert path == tmp_path / "out" / LESSONS[-1] and path.exists()
    assert lesson.read_bytes() == before
    [path] = student_copy(tmp_path / "rel", [f"tutorials/{LESSONS[0]}"])
    assert path == tmp_path / "rel" / LESSONS[0]


def test_student_copy_blanks_and_clears(tmp_path):
    lesson = LESSONS[0]
    [path] = student_copy(tmp_path, [lesson])
    assert (tmp_path / "_lesson.py").exists()
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code)
    assert "widgets" not in nb.metadata
    text = "\n".join(c.source for c in code)
    assert "# reference answer" not in text
    reference = nbformat.read(TUTORIALS / lesson, as_version=4)
    assert text.count("...  # your answer") >= len(exercises(reference)) >= 3


def turn_checks(nb) -> list[int]:
    """In a student copy: the check cells, each the code cell right after a *your turn* cell."""
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    return [j for i, j in zip(code, code[1:]) if nb.cells[i].source.startswith("# your turn")]


def blank_faults(nb, path: Path) -> dict[str, object]:
    """Run a student copy ``nb`` top to bottom, every exercise left blank, as a student would,
    and return what a student should never see (empty lists and dicts: nothing wrong):

    * ``passes``: checks that pass on a blank answer;
    * ``not_hint``: checks that fail otherwise than with one ``AssertionError`` (a ``TypeError``,
      a planner's error, a missing name: a traceback, not the hint), index -> error names;
    * ``silent``: checks whose ``AssertionError`` carries no hint;
    * ``outside``: other cells that fail (a later cell needing an exercise's answer).
    """
    from nbclient import NotebookClient

    NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(path)}}).execute()
    failed = {i: [o for o in c.outputs if o["output_type"] == "error"]
              for i, c in enumerate(nb.cells) if c.cell_type == "code"}
    checks = turn_checks(nb)
    return {
        "passes": [i for i in checks if not failed[i]],
        "not_hint": {i: [o["ename"] for o in failed[i]] for i in checks
                     if failed[i] and [o["ename"] for o in failed[i]] != ["AssertionError"]},
        "silent": [i for i in checks if failed[i] and not all(o["evalue"].strip() for o in failed[i])],
        "outside": {i: [o["ename"] for o in f] for i, f in failed.items() if f and i not in checks},
    }


def test_blank_faults_finds_what_a_student_should_not_see(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src) for src in (
        "# your turn\nx = ...  # your answer",
        "# check\nassert x is not ... and x == 4, 'hint: two and two'",
        "# your turn\ny = ...  # your answer",
        "# check\nassert True    # a check that cannot fail",
        "# your turn\nz = ...  # your answer",
        "# check\nassert z + 1 == 2, 'hint: one'   # ... + 1: a TypeError, not the hint",
        "# your turn\nw = ...  # your answer",
        "# check\nassert w is not ...",
        "print(z + 1)   # a later cell that needs an answer",
    )])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    assert blank_faults(nb, tmp_path) == {"passes": [3], "not_hint": {5: ["TypeError"]},
                                          "silent": [7], "outside": {8: ["TypeError"]}}


@pytest.mark.slow
@pytest.mark.parametrize("lesson", LESSONS)
def test_student_copy_shows_hints_on_blanks(tmp_path, lesson):
    """A student who leaves every exercise blank runs the copy to the end and sees, at each
    check and only there, its hint: an ``AssertionError`` with a message, never a traceback
    (``TypeError``, a planner's error, a missing name) and never a pass. One run of the copy
    per lesson; that the checks pass on the reference answers, nbval checks on the lesson."""
    [path] = student_copy(tmp_path, [lesson])
    nb = nbformat.read(path, as_version=4)
    reference = nbformat.read(TUTORIALS / lesson, as_version=4)
    assert len(turn_checks(nb)) == len(exercises(reference)), lesson
    faults = blank_faults(nb, tmp_path)
    assert faults == {"passes": [], "not_hint": {}, "silent": [], "outside": {}}, \
        f"{lesson} (cell indices in the student copy): {faults}"
