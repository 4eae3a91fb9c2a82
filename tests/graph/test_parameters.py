"""The parameters table: captured rows (tied, shared, frozen, unread, buffers), the default for
synthetic graphs, validation errors, agreement with the unit columns and the JSON round trip."""
import pandas as pd
import pytest
import torch
from torch import nn

from memflow.errors import GraphError
from memflow.graph import OpGraph
from memflow.graph.capture import from_torch

from capture_models import CASES, assert_matches_model


def rows(g: OpGraph) -> pd.DataFrame:
    return g.parameters.set_index("name")


@pytest.mark.parametrize("case, first, second", [
    ("tied-inplace", "embed", "head"),
    ("hf-gpt2", "transformer.wte", "lm_head"),              # Hugging Face ties its head too
])
def test_tied_weight_is_one_row_read_by_both_units(case, first, second):
    model, ids = CASES[case]()
    g = from_torch(model, ids)
    assert_matches_model(g, model)
    tied = rows(g).loc[f"{first}.weight"]
    assert tied["names"] == [f"{first}.weight", f"{second}.weight"]
    assert tied["readers"] == [first, second] and tied["owner"] == first
    assert g.units.loc[first, "param_bytes"] == tied["bytes"] > 0
    assert g.units.loc[second, "param_bytes"] == 0       # counted once, in its first reader


def test_a_module_called_twice_is_read_by_both_spans():
    lin = nn.Linear(8, 8)
    model = nn.ModuleDict({"lin": lin})
    model.forward = lambda x: lin(torch.relu(lin(x)))
    g = from_torch(model, torch.randn(2, 8))
    assert rows(g).loc["lin.weight", "readers"] == ["lin", "lin#2"]
    assert g.units.loc["lin", "params"] == 8 * 8 + 8 and g.units.loc["lin#2", "params"] == 0


def test_buffers_frozen_and_unread_parameters():
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)
            self.bn = nn.BatchNorm2d(4)
            self.frozen = nn.Linear(4, 4).requires_grad_(False)
            self.unused = nn.Parameter(torch.zeros(5))        # no op reads it

        def forward(self, x):
            return self.frozen(self.bn(self.conv(x)).mean((2, 3)))

    model = Model()
    g = from_torch(model, torch.randn(2, 3, 8, 8))
    assert_matches_model(g, model)
    t = rows(g)
    assert t.loc["bn.num_batches_tracked", ["is_buffer", "trainable", "dtype", "bytes"]].tolist() \
        == [True, False, "int64", 8]
    assert t.loc["bn.running_mean", "readers"] == ["bn"]
    assert not t.loc["frozen.weight", "trainable"]
    assert g.units.loc["frozen", "trainable_bytes"] == 0 < g.units.loc["frozen", "param_bytes"]
    # An unread parameter of the root goes to the root's first unit, and has no reader.
    assert t.loc["unused", "readers"] == []
    assert t.loc["unused", "owner"] == "<root>"
    assert g.units.loc["bn", "buffer_bytes"] == 4 * 4 * 2 + 8


def synthetic(**params):
    units = pd.DataFrame({"fwd_flops": [1.0, 1.0, 1.0], "bwd_flops": [2.0, 2.0, 2.0], **params},
                         index=["a", "b", "c"])
    tensors = pd.DataFrame({"bytes": [8], "producer": ["<input>"], "consumers": [["a"]]})
    return units, tensors


def test_default_table_from_the_unit_columns():
    units, tensors = synthetic(params=[10, 0, 6], param_bytes=[40, 0, 24],
                               trainable_bytes=[40, 0, 8], buffer_bytes=[0, 16, 0])
    g = OpGraph(units, tensors)
    t = rows(g)
    assert t.index.tolist() == ["a:params", "b:buffers", "c:params", "c:frozen"]
    assert t.loc["c:params", ["bytes", "numel", "trainable"]].tolist() == [8, 2, True]
    assert t.loc["c:frozen", ["bytes", "numel", "trainable"]].tolist() == [16, 4, False]
    assert t["readers"].tolist() == [["a"], ["b"], ["c"], ["c"]]
    pd.testing.assert_frame_equal(g.units[["params", "param_bytes", "trainable_bytes",
                                           "buffer_bytes"]], units[["params", "param_bytes",
                                                                    "trainable_bytes",
                                                                    "buffer_bytes"]],
                                  check_names=False)


def test_units_without_parameter_columns_own_nothing():
    g = OpGraph(*synthetic())
    assert len(g.parameters) == 0 and g.units["param_bytes"].sum() == 0


def tied(**changes):
    row = {"name": "w", "names": ["w", "v"], "bytes": 64, "numel": 16, "owner": "a",
           "readers": ["a", "c"], **changes}
    return pd.DataFrame([row])


def test_given_table_is_the_source_of_the_unit_columns():
    units, tensors = synthetic()
    g = OpGraph(units, tensors, parameters=tied())
    assert g.units["param_bytes"].tolist() == [64, 0, 0]
    assert g.units["trainable_bytes"].tolist() == [64, 0, 0]
    # The graph's own units (derived columns included) and table rebuild the same graph.
    g2 = OpGraph(g.units, g.tensors.drop(columns=["first_saver", "last_consumer"]),
                 parameters=g.parameters)
    pd.testing.assert_frame_equal(g.units, g2.units)


@pytest.mark.parametrize("changes, match", [
    ({"owner": "zz", "readers": []}, "parameter 'w': owner 'zz' is not a unit"),
    ({"readers": ["a", "zz"]}, "parameter 'w': reader 'zz' is not a unit"),
    ({"readers": ["c", "a"], "owner": "c"}, "parameter 'w': readers .* execution order"),
    ({"readers": ["a", "a"]}, "parameter 'w': readers .* distinct"),
    ({"owner": "b"}, "parameter 'w': owner 'b' is not its first reader 'a'"),
    ({"bytes": -1}, "parameter 'w': bytes is negative"),
    ({"is_buffer": True}, "parameter 'w': a buffer cannot be trainable"),
    ({"names": ["v"]}, r"parameter 'w': names \['v'\] must include its name"),
    ({"name": ""}, "a name is empty"),
])
def test_bad_table_names_the_parameter(changes, match):
    units, tensors = synthetic()
    with pytest.raises(GraphError, match=match):
        OpGraph(units, tensors, parameters=tied(**changes))


def test_a_name_in_two_rows_is_an_error():
    units, tensors = synthetic()
    two = pd.concat([tied(), tied(name="u", names=["u", "v"])], ignore_index=True)
    with pytest.raises(GraphError, match="parameter 'u': the name 'v' also names parameter 'w'"):
        OpGraph(units, tensors, parameters=two)


def test_missing_column_and_disagreeing_units_are_errors():
    units, tensors = synthetic()
    with pytest.raises(GraphError, match="lacks the required column 'numel'"):
        OpGraph(units, tensors, parameters=tied().drop(columns=["numel"]))
    units["param_bytes"] = [64, 4, 0]
    with pytest.raises(GraphError, match="unit 'b': param_bytes is 4 but the parameters table "
                                         "gives it 0"):
        OpGraph(units, tensors, parameters=tied())
    units["param_bytes"] = [64, 0, 0]
    units["trainable_bytes"] = [65, 0, 0]
    with pytest.raises(GraphError, match="unit 'a': trainable_bytes"):
        OpGraph(units, tensors)


def test_json_round_trip_keeps_the_table(tmp_path):
    model, ids = CASES["tied-inplace"]()
    g = from_torch(model, ids)
    g2 = OpGraph.load(g.save(tmp_path / "g.json"))
    pd.testing.assert_frame_equal(g.parameters, g2.parameters)
    pd.testing.assert_frame_equal(g.units, g2.units)


def test_a_document_without_the_table_gets_the_default():
    units, tensors = synthetic(params=[10, 0, 0], param_bytes=[40, 0, 0],
                               trainable_bytes=[40, 0, 0])
    doc = OpGraph(units, tensors).to_dict()
    doc["format"] = "memflow.graph/1"             # written before the table existed
    doc["units"].update({c: list(units[c]) for c in ("params", "param_bytes",
                                                     "trainable_bytes")})
    del doc["parameters"]
    g = OpGraph.from_dict(doc)
    assert g.parameters["name"].tolist() == ["a:params"]
    assert g.units["params"].tolist() == [10, 0, 0]


def test_tensor_split_marks_what_a_split_block_shards():
    """A split GPT-2 block shards its linears' weights and its column-parallel biases
    (memflow.graph.slicing.split_parameters, the plan export runs); its norms, the row-parallel
    biases (attention and MLP output projections) and its causal mask stay whole on every
    rank, and its unit's replicated_bytes sums those."""
    import memflow
    g = memflow.zoo.graph("gpt2", batch_size=2, units="blocks", vocab=40, max_positions=16,
                          hidden=16, n_layer=1, n_head=2, seq_len=6)
    t = rows(g)
    whole = set(t.index[(t["owner"] == "h.0") & ~t["tensor_split"]])
    assert whole == {"h.0.ln_1.weight", "h.0.ln_1.bias", "h.0.ln_2.weight", "h.0.ln_2.bias",
                     "h.0.attn.proj.bias", "h.0.mlp.proj.bias", "h.0.attn.mask"}
    assert g.units.loc["h.0", "replicated_bytes"] == t.loc[sorted(whole), "bytes"].sum()
    assert t.loc["wte.weight", "tensor_split"] and not t.loc["ln_f.weight", "tensor_split"]


def test_a_table_without_tensor_split_splits_parameters_and_no_buffer():
    units = pd.DataFrame({"params": [10], "param_bytes": [40], "trainable_bytes": [40],
                          "buffer_bytes": [8], "fwd_flops": [1.0], "bwd_flops": [2.0]},
                         index=["bn"])
    tensors = pd.DataFrame({"bytes": [8], "producer": ["<input>"], "consumers": [["bn"]]})
    g = OpGraph(units, tensors)
    assert g.parameters["tensor_split"].tolist() == [True, False]
    assert g.units.loc["bn", "replicated_bytes"] == 8
