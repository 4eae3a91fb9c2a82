"""Every field of a strategy document, given a wrong type or length, is an error that names
the file, the field and what is valid (never a raw TypeError/ValueError, never a truncation)."""
import json

import pytest

from memflow.errors import FileFormatError, StrategyError
from memflow.strategy import Strategy

DOC = Strategy(["a", "b"], devices=[("gpu0", "gpu1")] * 2, sample=[2, 2]).with_policy(
    {"b": "compress:0.01"}).to_dict()

BAD = [  # field, wrong value, what the message must say
    ("units", None, "'units' must be a list of strings, got null"),
    ("units", ["a", 3], "'units' must be a list of strings, got 3 at [1]"),
    ("policy", ["keep", "swap"], "'policy' must be one of keep, recompute"),
    ("policy", "keep", "'policy' must be a list of 2 policy names"),
    ("policy", ["keep"], "'policy' must be a list of 2 policy names, got a list of 1"),
    ("error_bound", [None, "x"], "'error_bound' must be a list of 2 numbers > 0 or nulls, got 'x'"),
    ("error_bound", [None, -1], "got -1 at [1]"),
    ("error_bound", [None], "'error_bound' must be a list of 2"),
    ("sample", ["two", 2], "'sample' must be a list of 2 integers >= 1, got 'two' at [0]"),
    ("sample", [2.5, 2], "got 2.5 at [0]"),
    ("sample", [True, 2], "got True at [0]"),
    ("sample", [0, 2], "got 0 at [0]"),
    ("sample", [2, 2, 2], "got a list of 3"),
    ("parameter", [1, None], "'parameter' must be a list of 2 integers >= 1, got null"),
    ("attribute", "1", "'attribute' must be a list of 2 integers >= 1, got '1'"),
    ("stage", [-2, 0], "'stage' must be a list of 2 integers >= -1"),
    ("devices", [["gpu0", "gpu1"], "gpu0"], "'devices' must be a list of 2 non-empty lists"),
    ("devices", [["gpu0", "gpu1"], []], "got [] at [1] (unit 'b')"),
    ("devices", [["gpu0", 1], ["gpu0"]], "at [0] (unit 'a')"),
    ("segment_break", [0, 1], "'segment_break' must be a list of 2 booleans, got 0 at [0]"),
    ("microbatches", "x", "'microbatches' must be an integer >= 1, got 'x'"),
    ("microbatches", 1.5, "got 1.5"),
    ("microbatches", 0, "got 0"),
    ("schedule", "zigzag", "'schedule' must be one of 'gpipe', '1f1b', got 'zigzag'"),
    ("schedule", 3, "got 3"),
    ("name", ["x"], "'name' must be a string, got ['x']"),
]


@pytest.mark.parametrize("field, value, message", BAD, ids=[f"{f}={v!r}" for f, v, _ in BAD])
def test_a_wrong_field_names_the_file_and_the_field(tmp_path, field, value, message):
    path = tmp_path / "strategy.json"
    path.write_text(json.dumps({**DOC, field: value}))
    with pytest.raises(FileFormatError) as err:
        Strategy.from_json(path)
    assert str(err.value).startswith(f"{path}: field '{field}'")
    assert message in str(err.value)


@pytest.mark.parametrize("field", [k for k in DOC if k not in ("format", "segment_break")])
def test_a_missing_field_is_named(tmp_path, field):
    path = tmp_path / "strategy.json"
    path.write_text(json.dumps({k: v for k, v in DOC.items() if k != field}))
    with pytest.raises(FileFormatError, match=rf"strategy\.json: lacks the field '{field}'"):
        Strategy.from_json(path)


def test_a_document_that_is_not_an_object(tmp_path):
    path = tmp_path / "strategy.json"
    path.write_text("[1, 2]")
    with pytest.raises(FileFormatError, match="strategy.json"):
        Strategy.from_json(path)
    with pytest.raises(FileFormatError, match="strategy document: the document must be a JSON object"):
        Strategy.from_dict([1, 2])


def test_the_right_document_still_reads():
    assert Strategy.from_dict(DOC).to_dict() == DOC


def test_non_integer_degrees_are_not_truncated():
    with pytest.raises(StrategyError, match="unit 'a': sample 2.5 is not an integer"):
        Strategy(["a"], devices=[("gpu0", "gpu1")], sample=[2.5])
    with pytest.raises(StrategyError, match="unit 'a': stage 0.5 is not an integer"):
        Strategy(["a"], devices=[("gpu0",)]).with_config("a", stage=0.5)
    assert Strategy(["a"], devices=[("gpu0", "gpu1")], sample=[2.0]).sample.tolist() == [2]


def test_a_segment_break_on_a_kept_unit_names_the_file(tmp_path):
    path = tmp_path / "strategy.json"
    path.write_text(json.dumps({**DOC, "segment_break": [False, True]}))
    with pytest.raises(StrategyError, match=r"strategy\.json: unit 'b': a segment break"):
        Strategy.from_json(path)
