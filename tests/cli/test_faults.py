"""Malformed plan files, batches that do not split, limits under a byte and a search that finds
nothing that fits: one line, a documented exit status, never a traceback."""
import json
import shutil

import pytest

from memflow.cli import main
from memflow.cli.commands import EXIT_STATUS, INFEASIBLE

from .conftest import CLUSTER, SMALL


def one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    return err


@pytest.fixture
def copy(plan, tmp_path):
    """A copy of the session's plan folder to spoil."""
    return shutil.copytree(plan, tmp_path / "plan")


def spoil(path, **fields):
    doc = json.loads(path.read_text())
    doc.update(fields)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("field, value", [("sample", "two"), ("microbatches", "x"),
                                          ("error_bound", "x"), ("units", None),
                                          ("sample", [2.5] * 4), ("stage", [-1])])
def test_simulate_names_the_strategy_file_and_field(copy, capsys, field, value):
    spoil(copy / "strategy.json", **{field: value})
    assert main(["simulate", *SMALL, *CLUSTER, "--strategy", str(copy / "strategy.json")]) == 2
    assert f"strategy.json: field '{field}' must be" in one_line(capsys)


def test_report_names_the_search_file_and_field(copy, capsys):
    doc = json.loads((copy / "search.json").read_text())
    doc["settings"]["beta"] = "hot"
    (copy / "search.json").write_text(json.dumps(doc))
    assert main(["report", str(copy)]) == 2
    assert "search.json: field 'settings.beta' must be a number > 0, got 'hot'" in one_line(capsys)


def test_report_on_a_search_from_another_model_names_both_files(copy, tmp_path, capsys):
    other = tmp_path / "other"
    assert main(["search", "--model", "chain", "--option", "n=3", "--option", "width=8",
                 "--batch", "8", *CLUSTER, "--iterations", "3", "--quiet",
                 "--out", str(other)]) == 0
    shutil.copy(other / "search.json", copy / "search.json")
    capsys.readouterr()
    assert main(["report", str(copy)]) == 2
    err = one_line(capsys)
    assert "strategy.json does not fit the model of" in err and "search.json (chain, 3 units" in err


def test_report_reads_a_null_acceptance_rate(copy):
    spoil(copy / "summary.json", acceptance_rate=None)
    assert main(["report", str(copy), "--out", str(copy / "r.html")]) == 0


def test_report_names_a_bad_summary_field(copy, capsys):
    spoil(copy / "summary.json", iterations="many")
    assert main(["report", str(copy)]) == 2
    assert "summary.json: field 'iterations' must be an integer >= 0" in one_line(capsys)


def test_a_batch_the_sample_degree_does_not_divide(replicated, capsys):
    assert main(["simulate", "--model", "chain", "--option", "n=4", "--option", "width=32",
                 "--batch", "7", *CLUSTER, "--strategy", str(replicated)]) == 2
    assert "sample degree 2 does not divide the batch of 7" in one_line(capsys)


def test_a_limit_under_one_byte(capsys):
    assert main(["search", *SMALL, *CLUSTER, "--memory-limit", "0.5B", "--iterations", "1"]) == 2
    assert "less than one byte" in one_line(capsys)


def test_an_infeasible_search_exits_3_and_says_by_how_much(tmp_path, capsys):
    assert main(["search", *SMALL, *CLUSTER, "--memory-limit", "4KiB", "--iterations", "5",
                 "--quiet", "--out", str(tmp_path / "plan")]) == INFEASIBLE == 3
    err = one_line(capsys)
    assert err.startswith("memflow: no strategy found fits: the best one's gpu")
    assert "of its 4.00 KiB" in err and "too much" in err
    assert (tmp_path / "plan" / "strategy.json").is_file()
    assert 3 in EXIT_STATUS and "exit status" in main.__globals__["parser"]().format_help()
