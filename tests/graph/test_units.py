"""Unit granularities, names and glue rules; sums over units equal the whole model."""
import pytest
import torch
from torch import nn

from memflow.errors import CaptureError
from memflow.graph.capture import from_torch
from memflow.graph.units import select_units

from capture_models import CASES, ResNetish

ADDITIVE = ["params", "param_bytes", "trainable_bytes", "buffer_bytes", "saved_bytes",
            "fwd_flops", "bwd_flops", "fwd_bytes_moved", "bwd_bytes_moved", "fwd_ops",
            "bwd_ops"]


@pytest.fixture(scope="module")
def resnet():
    torch.manual_seed(0)
    return CASES["residual"]()


@pytest.fixture(scope="module")
def graphs(resnet):
    model, x = resnet
    return {units: from_torch(model, x, units=units)
            for units in ("leaves", "blocks", 0, 1, 2)}


def test_sums_over_units_are_the_same_at_every_granularity(graphs, resnet):
    model, _ = resnet
    leaves = graphs["leaves"].units[ADDITIVE].sum()
    assert leaves["params"] == sum(p.numel() for p in model.parameters())
    assert leaves["buffer_bytes"] == sum(b.untyped_storage().nbytes() for b in model.buffers())
    for units, g in graphs.items():
        assert (g.units[ADDITIVE].sum() == leaves).all(), units


def test_leaves_name_every_leaf_and_the_glue_between_them(graphs):
    g = graphs["leaves"]
    assert g.names[:3] == ["stem", "blocks.0.conv1", "blocks.0.bn1"]
    # The residual add and the final ReLU's input are the block's own code: glue.
    assert g.units.loc["blocks.0", "role"] == "glue"
    assert g.units.loc["blocks.0", "kind"] == "Residual"
    # relu runs twice per block: the second span is relu#2 with call == 2.
    assert g.units.loc["blocks.0.relu#2", "call"] == 2
    assert g.units.loc["blocks.0.relu#2", "module"] == "blocks.0.relu"
    # flatten in the model's own forward is glue of the root.
    assert g.units.loc["<root>", "role"] == "glue"
    assert set(g.units.loc[g.units.role == "module", "kind"]) == {
        "Conv2d", "BatchNorm2d", "ReLU", "AdaptiveAvgPool2d", "Linear"}


def test_blocks_select_repeated_children_and_leaves_elsewhere(graphs, resnet):
    assert graphs["blocks"].names == ["stem", "blocks.0", "blocks.1", "pool", "<root>", "fc"]
    assert (graphs["blocks"].units.loc[["blocks.0", "blocks.1"], "role"] == "module").all()
    model, _ = resnet
    assert select_units(model, "blocks") == {"stem", "blocks.0", "blocks.1", "pool", "fc"}


def test_blocks_include_a_lone_module_list_layer():
    model = nn.Sequential(nn.Linear(4, 4), nn.ModuleList([nn.Sequential(nn.Linear(4, 4))]))
    assert select_units(model, "blocks") == {"0", "1.0"}


def test_depth_selects_modules_at_that_depth_and_shallower_leaves(graphs):
    assert graphs[0].names == ["<root>"]
    assert graphs[0].units.loc["<root>", "role"] == "module"
    assert graphs[1].names == ["stem", "blocks", "pool", "<root>", "fc"]
    assert graphs[2].names == graphs["blocks"].names


def test_explicit_list_makes_everything_else_glue_of_its_innermost_module(resnet):
    model, x = resnet
    g = from_torch(model, x, units=["blocks.1", "fc"])
    assert g.units.loc["blocks.1", "role"] == "module"
    assert g.units.loc["stem", "role"] == "glue"           # a leaf not asked for
    assert g.units.loc["blocks.0.conv1", "role"] == "glue"
    assert "blocks.1.conv1" not in g.names                 # inside a selected module


def test_units_are_in_execution_order_and_edges_follow_data(graphs):
    g = graphs["blocks"]
    edges = set(zip(g.edges["src"], g.edges["dst"]))
    assert ("stem", "blocks.0") in edges and ("blocks.0", "blocks.1") in edges
    order = {n: i for i, n in enumerate(g.names)}
    assert all(order[s] < order[d] for s, d in edges)


def test_module_called_twice_gives_two_units_sharing_parameters():
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(8, 8)

        def forward(self, x):
            return self.layer(torch.relu(self.layer(x)))

    g = from_torch(Twice(), torch.randn(4, 8))
    assert g.names == ["layer", "<root>", "layer#2"]
    assert g.units.loc["layer", "params"] == 72 and g.units.loc["layer#2", "params"] == 0
    assert g.units.loc["layer#2", "call"] == 2


def test_tied_weights_count_once_in_the_first_unit_that_uses_them():
    torch.manual_seed(0)
    model, ids = CASES["tied-inplace"]()
    g = from_torch(model, ids)
    assert g.units.loc["embed", "params"] == 50 * 16
    assert g.units.loc["head", "params"] == 0
    assert g.units.loc["head", "max_parameter_degree"] == 50     # it still reads the weight
    assert g.units["params"].sum() == sum(p.numel() for p in model.parameters())


def test_unused_parameters_belong_to_their_module():
    class Spare(nn.Module):
        def __init__(self):
            super().__init__()
            self.used, self.unused = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x):
            return self.used(x)

    model = Spare()
    g = from_torch(model, torch.randn(2, 4))
    assert g.units["params"].sum() == 40


@pytest.mark.parametrize("units, message", [
    ("layers", "not a granularity"),
    (-1, "depth must be >= 0"),
    (1.5, "got float"),
    (["blocks.0.conv3"], "close matches: blocks.0.conv2, blocks.0.conv1"),
    ([], "empty"),
])
def test_bad_units_are_clear_errors(resnet, units, message):
    model, x = resnet
    with pytest.raises(CaptureError, match=message):
        from_torch(model, x, units=units)


def test_root_can_be_named_in_a_list():
    model = ResNetish()
    assert select_units(model, ["<root>"]) == select_units(model, [""]) == {"<root>"}
