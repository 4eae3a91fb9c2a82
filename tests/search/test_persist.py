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
