"""The OpGraph container: derived columns, validation errors, JSON round trip."""
import pandas as pd
import pytest

from memflow.errors import FileFormatError, GraphError
from memflow.graph import OpGraph


def chain():
    units = pd.DataFrame({"fwd_flops": [1.0, 2.0, 3.0], "bwd_flops": [2.0, 4.0, 6.0]},
                         index=["a", "b", "c"])
    tensors = pd.DataFrame({
        "bytes": [10, 20, 30, 40, 5],
        "producer": ["<input>", "a", "b", "c", "b"],
        "consumers": [["a"], ["b", "c"], ["c"], [], []],
        "savers": [["a"], ["b", "c"], [], [], ["b"]],
        "is_output": [False, False, False, True, False],
    })
    return OpGraph(units, tensors, {"model": "toy"})


def test_derived_columns_count_each_storage_once():
    g = chain()
    u = g.units
    assert u.loc["c", "input_bytes"] == 20 + 30          # skip edge from a and b's output
    assert u.loc["a", "output_bytes"] == 20
    assert u.loc["a", "saved_bytes"] == 10               # a saved the model input
    assert u.loc["b", "saved_bytes"] == 20 + 5           # first saver of a's output, and its own
    assert g.units["saved_bytes"].sum() == 10 + 20 + 5
    assert g.tensors.loc[1, "first_saver"] == "b"
    assert g.tensors.loc[1, "last_consumer"] == "c"


def test_edges_and_networkx():
    g = chain()
    assert g.edges.to_dict(orient="list") == {"src": ["a", "a", "b"], "dst": ["b", "c", "c"],
                                              "bytes": [20, 20, 30]}
    nxg = g.to_networkx()
    assert list(nxg.nodes) == ["a", "b", "c"] and nxg.edges["a", "c"]["bytes"] == 20


def test_unknown_unit_is_named():
    g = chain()
    bad = g.tensors.drop(columns=["first_saver", "last_consumer"]).copy()
    bad.at[0, "consumers"] = ["zz"]
    with pytest.raises(GraphError, match="'zz'"):
        OpGraph(g.units, bad)


def test_consumer_before_producer_is_an_error():
    g = chain()
    bad = g.tensors.drop(columns=["first_saver", "last_consumer"]).copy()
    bad.at[2, "consumers"] = ["a"]
    with pytest.raises(GraphError, match="execution order"):
        OpGraph(g.units, bad)


def test_negative_numbers_are_errors():
    g = chain()
    units = g.units.copy()
    units.loc["b", "fwd_flops"] = -1
    with pytest.raises(GraphError, match="unit 'b': fwd_flops"):
        OpGraph(units, g.tensors.drop(columns=["first_saver", "last_consumer"]))


def test_json_round_trip(tmp_path):
    g = chain()
    path = g.save(tmp_path / "g.json")
    g2 = OpGraph.load(path)
    pd.testing.assert_frame_equal(g.units, g2.units)
    pd.testing.assert_frame_equal(g.tensors, g2.tensors)
    assert g2.meta == {"model": "toy"}


def test_corrupt_file_names_the_file(tmp_path):
    p = tmp_path / "g.json"
    p.write_text("{not json")
    with pytest.raises(FileFormatError, match="g.json"):
        OpGraph.load(p)


def test_summary_and_html():
    g = chain()
    s = g.summary()
    assert s.loc["total", "saved_bytes"] == g.units["saved_bytes"].sum()
    assert "OpGraph toy" in g._repr_html_()
