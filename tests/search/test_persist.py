"""save/load: the same chain resumes (same proposals), corrupt or mismatched files are errors
that name the file and the mismatch."""
import json

import pandas as pd
import pytest

import memflow
from memflow.errors import FileFormatError, SearchError
from memflow.search import MCMCSearch

from .helpers import FOUR, V100, chain


def same_rows(a: pd.DataFrame, b: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(a.drop(columns="elapsed"), b.drop(columns="elapsed"))


def test_resumes_the_same_chain(tmp_path):
    g = chain(6, batch=256)
    straight = MCMCSearch(g, FOUR, memory_limit=30e6, seed=7).step(120)
    first = MCMCSearch(g, FOUR, memory_limit=30e6, seed=7).step(50)
    first.pin("l1", policy="recompute").unpin("l1")
    path = first.save(tmp_path / "s.json")
    again = MCMCSearch.load(path, g, FOUR).step(70)
    first.step(70)
    same_rows(again.history, first.history)
    assert again.best == first.best and again.current == first.current
    assert again.elapsed >= first.history["elapsed"].iloc[49]
    # the save/load does not change the chain: 50 + 70 steps equal 120 in one go
    same_rows(straight.history.iloc[:50], again.history.iloc[:50])


def test_pins_survive_and_embedded_file_needs_nothing_else(tmp_path):
    g = chain(5)
    s = MCMCSearch(g, V100, seed=1).pin(["l2"], policy="compress:1e-2").step(20)
    path = s.save(tmp_path / "s.json", embed=True)
    back = MCMCSearch.load(path)
    assert back.pins == {"l2": "compress:0.01"} and back.space.pinned[2]
    same_rows(back.step(30).history, s.step(30).history)


def test_other_graph_or_cluster_is_named(tmp_path):
    path = MCMCSearch(chain(5), V100).step(3).save(tmp_path / "s.json")
    with pytest.raises(SearchError, match=r"s\.json: the search was saved for another graph"):
        MCMCSearch.load(path, chain(6), V100)
    with pytest.raises(SearchError, match="another cluster .*'name': '1xV100-16GB'"):
        MCMCSearch.load(path, chain(5), memflow.Cluster.preset("1xA100-40GB"))
    with pytest.raises(SearchError, match="give the graph and cluster"):
        MCMCSearch.load(path)


def test_corrupt_files_are_named(tmp_path):
    path = MCMCSearch(chain(4), V100).step(3).save(tmp_path / "s.json")
    text = path.read_text()
    (tmp_path / "cut.json").write_text(text[: len(text) // 2])
    with pytest.raises(FileFormatError, match=r"cut\.json: not valid JSON"):
        MCMCSearch.load(tmp_path / "cut.json", chain(4), V100)
    doc = json.loads(text)
    del doc["chain"]
    (tmp_path / "nochain.json").write_text(json.dumps(doc))
    with pytest.raises(FileFormatError, match=r"nochain\.json: saved search lacks the field 'chain'"):
        MCMCSearch.load(tmp_path / "nochain.json", chain(4), V100)
    (tmp_path / "other.json").write_text(json.dumps({"format": "memflow.strategy/1"}))
    with pytest.raises(FileFormatError, match="expected a 'memflow.search' document"):
        MCMCSearch.load(tmp_path / "other.json", chain(4), V100)
    doc = json.loads(text)
    doc["chain"]["rng"] = {"bit_generator": "Nope"}
    (tmp_path / "rng.json").write_text(json.dumps(doc))
    with pytest.raises(FileFormatError, match=r"rng\.json: field .chain\.rng\.bit_generator. must be a numpy bit generator"):
        MCMCSearch.load(tmp_path / "rng.json", chain(4), V100)


def _set(doc, dotted, value):
    *parents, last = dotted.split(".")
    for key in parents:
        doc = doc[key]
    doc[last] = value


WRONG = [  # field of search.json, wrong value, what the message must say
    ("settings.beta", "hot", "field 'settings.beta' must be a number > 0, got 'hot'"),
    ("settings.seed", 1.5, "field 'settings.seed' must be an integer >= 0, got 1.5"),
    ("settings.memory_aware", "yes", "field 'settings.memory_aware' must be true or false"),
    ("settings.restart_every", -1, "field 'settings.restart_every' must be an integer >= 0"),
    ("settings.policies", "keep", "field 'settings.policies' must be a list of strings"),
    ("settings.error_bounds", [0], "field 'settings.error_bounds' must be a list of numbers > 0"),
    ("settings.moves", {"policy": "x"}, "field 'settings.moves.policy' must be a number >= 0"),
    ("settings.memory_limit", [1], "field 'settings.memory_limit' must be null, a number"),
    ("settings.optimizer", "lion", "field 'settings': unknown optimizer"),
    ("settings", None, "field 'settings' must be a JSON object, got null"),
    ("graph.fingerprint", 3, "field 'graph.fingerprint' must be a string, got 3"),
    ("chain.current.sample", "two", "field 'chain.current.sample' must be a list of"),
    ("chain.best.microbatches", "x", "field 'chain.best.microbatches' must be an integer >= 1"),
    ("chain.current.units", None, "field 'chain.current.units' must be a list of strings, got null"),
    ("chain.current_score.time", "x", "field 'chain.current_score.time' must be a number >= 0"),
    ("chain.best_score.peak", [None], "field 'chain.best_score.peak' must be a list of 1 numbers"),
    ("chain.current_score.peak", [1.0, 2.0], "'chain.current_score.peak' must be a list of 1 "
     "numbers, got a list of 2"),
    ("history.peaks", [[1.0, 2.0]] * 5, "'history.peaks' must be a list of lists of 1 numbers"),
    ("chain.iteration", -3, "field 'chain.iteration' must be an integer >= 0"),
    ("chain.seen_feasible", 1, "field 'chain.seen_feasible' must be true or false, got 1"),
    ("chain.reference", None, "field 'chain.reference' must be a number > 0, got null"),
    ("chain.rng.state", "x", "field 'chain.rng' is not a PCG64 state"),
    ("history.time", ["x"], "field 'history.time' must be a list of numbers, got 'x' at [0]"),
    ("history.accepted", None, "field 'history.accepted' must be a list of booleans"),
    ("history.devices", [0], "field 'history.devices' must be a list of 1 strings"),
    ("pins.policies", {"l1": 3}, "field 'pins.policies.l1' must be a string, got 3"),
    ("pins.policies", {"l9": "keep"}, "field 'pins': 'l9' is not a unit"),
]


@pytest.mark.parametrize("field, value, message", WRONG, ids=[f for f, _, _ in WRONG])
def test_every_field_is_type_checked(tmp_path, field, value, message):
    doc = MCMCSearch(chain(3), V100, seed=0).step(5).to_dict()
    _set(doc, field, value)
    path = tmp_path / "s.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(memflow.errors.MemflowError) as err:
        MCMCSearch.load(path, chain(3), V100)
    assert str(err.value).startswith(f"{path}: ") and message in str(err.value)


def test_a_renamed_unit_in_the_chain_names_the_file_and_field(tmp_path):
    doc = MCMCSearch(chain(3), V100, seed=0).step(5).to_dict()
    doc["chain"]["current"]["units"][1] = "renamed"
    path = tmp_path / "s.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(memflow.errors.StrategyError,
                       match=r"s\.json: field 'chain\.current': unit 'renamed' is not a unit"):
        MCMCSearch.load(path, chain(3), V100)
