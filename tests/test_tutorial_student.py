"""The student copies of the lessons (``tutorials/_lesson.py --student``): every exercise is
blanked, its check fails with its hint (an ``AssertionError`` with a message, never a
``TypeError`` or a planner's error) until it is answered, and the copy's instructions name what
its cells show. Every lesson has a *predict* exercise and an *explain why* question answered,
for the teacher only, in a model answer.

The structural tests read every lesson (fast). The executed test (``slow``) runs each lesson
in one kernel; at each exercise it runs the blanked *your turn* cell and its check (which must
fail, and not merely because a name is missing), then the reference answer and the rest of the
lesson as usual (which must pass) — so one run of a lesson tries every exercise both ways.
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

# A blanked check should fail on the student's `...`, not on a name the copy lost.
BROKEN_COPY = {"NameError", "SyntaxError", "ImportError", "ModuleNotFoundError"}


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


def trial_run(nb, path: Path) -> tuple[dict, dict]:
    """Run ``nb`` once, trying every exercise both ways: before each *your turn* cell, its
    blanked copy and its check (the student's copy), then the lesson as it is.

    Returns ``(unexpected, blank_checks, hints)``: the errors of cells that should have run
    clean (trial index -> error names), for each check tried on a blank answer its cell index
    in ``nb`` -> the error names it raised (empty: it passed on a blank), and that index ->
    the messages of its errors (the hints a student sees).
    """
    from nbclient import NotebookClient

    pairs = dict(exercises(nb))
    trial, tried = nbformat.v4.new_notebook(metadata=nb.metadata), {}
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        if i in pairs:
            trial.cells.append(nbformat.v4.new_code_cell(blank_answers(cell.source)))
            trial.cells.append(nbformat.v4.new_code_cell(nb.cells[pairs[i]].source))
            tried[len(trial.cells) - 1] = pairs[i]
        trial.cells.append(nbformat.v4.new_code_cell(cell.source))
    NotebookClient(trial, timeout=300, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(path)}}).execute()
    failed = {k: [o for o in c.outputs if o["output_type"] == "error"]
              for k, c in enumerate(trial.cells)}
    errors = {k: [o["ename"] for o in f] for k, f in failed.items()}
    unexpected = {k: e for k, e in errors.items() if e and k not in tried}
    return (unexpected, {check: errors[k] for k, check in tried.items()},
            {check: [o["evalue"] for o in failed[k]] for k, check in tried.items()})


def test_trial_run_finds_a_check_that_cannot_fail(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src) for src in (
        "# your turn\nx = 2 + 2  # reference answer",
        "# check\nassert x == 4, 'hint: two and two'",
        "# your turn\ny = 3  # reference answer",
        "# check\nassert True    # a check that cannot fail",
        "# your turn\nz = 1  # reference answer",
        "# check\nassert z + 1 == 2, 'hint: one'   # ... + 1: a TypeError, not the hint",
    )])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    unexpected, checks, hints = trial_run(nb, tmp_path)
    assert unexpected == {}
    assert checks == {1: ["AssertionError"], 3: [], 5: ["TypeError"]}
    assert hints[1] == ["hint: two and two"]


@pytest.mark.slow
@pytest.mark.parametrize("lesson", LESSONS)
def test_checks_fail_until_answered(lesson):
    nb = nbformat.read(TUTORIALS / lesson, as_version=4)
    unexpected, checks, hints = trial_run(nb, TUTORIALS)
    assert not unexpected, f"{lesson}: cells that raised (index in the trial run): {unexpected}"
    passed_blank = [check for check, errors in checks.items() if not errors]
    assert not passed_blank, f"{lesson}: these checks pass on a blank answer: {passed_blank}"
    broken = {check: e for check, e in checks.items() if set(e) & BROKEN_COPY}
    assert not broken, f"{lesson}: blanked checks fail for the wrong reason: {broken}"
    # on an untouched blank a student sees the check's hint, not a traceback
    not_hint = {check: e for check, e in checks.items() if e != ["AssertionError"]}
    assert not not_hint, f"{lesson}: blanked checks raise other errors than their hint: {not_hint}"
    silent = [check for check, h in hints.items() if not all(m.strip() for m in h)]
    assert not silent, f"{lesson}: blanked checks fail without a hint: {silent}"


@pytest.mark.slow
@pytest.mark.parametrize("lesson", LESSONS)
def test_student_copy_runs_past_its_blanks(tmp_path, lesson):
    """A student who leaves every exercise blank can still run the lesson to the end: only the
    check cells fail (with their hints), no later cell needs an exercise's answer."""
    from nbclient import NotebookClient

    [path] = student_copy(tmp_path, [lesson])
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    failed = {i: [o["ename"] for o in c.outputs if o["output_type"] == "error"]
              for i, c in enumerate(nb.cells) if c.cell_type == "code"}
    failed = {i: e for i, e in failed.items() if e}
    outside = {i: e for i, e in failed.items() if not nb.cells[i].source.startswith("# check")}
    assert not outside, f"{lesson}: cells other than checks fail on a blank copy: {outside}"
    assert all(e == ["AssertionError"] for e in failed.values()), failed
