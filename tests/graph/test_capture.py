"""from_torch: the numbers of each unit and tensor, meta data, and leaving the model alone."""
import resource

import pytest
import torch
from torch import nn

from memflow.graph import OpGraph
from memflow.graph.capture import from_torch

from capture_models import CASES, Recurrent


class Temporary(nn.Module):
    """exp(x repeated 4 times), summed: the repeat is a temporary of the forward, and its
    gradient one of the backward."""

    def forward(self, x):
        return torch.exp(x.repeat(1, 4)).sum(1)


def test_linear_flops_bytes_and_ops():
    b, n_in, n_out = 8, 16, 32
    g = from_torch(nn.Sequential(nn.Linear(n_in, n_out)), torch.randn(b, n_in))
    u = g.units.loc["0"]
    assert u["fwd_flops"] == 2 * b * n_in * n_out
    # One matmul for the weight gradient (x needs none), a sum over the batch for the bias.
    assert u["bwd_flops"] == u["fwd_flops"] + b * n_out
    assert u["fwd_bytes_moved"] == 4 * (b * n_in + n_in * n_out + n_out + b * n_out)
    assert u["fwd_ops"] == 1                              # addmm; the transpose is a view
    assert u["params"] == n_in * n_out + n_out
    assert u["param_bytes"] == u["trainable_bytes"] == 4 * u["params"]
    assert u["dtype"] == "float32"


def test_transient_bytes_of_forward_and_backward():
    x = torch.randn(8, 16, requires_grad=True)
    g = from_torch(nn.Sequential(Temporary()), x)
    u = g.units.loc["0"]
    repeat = 4 * x.numel() * 4
    # Peak: the repeat and exp's result; what survives: exp's result (saved) and the output.
    assert u["fwd_tmp_bytes"] == repeat - 8 * 4
    # Peak: the gradients of the repeat and of x; x's gradient survives.
    assert u["bwd_tmp_bytes"] == repeat
    assert u["saved_bytes"] == repeat                     # exp saves its result


@pytest.mark.parametrize("inplace", [False, True])
def test_backward_makes_gradients_while_it_still_holds_what_it_received(inplace):
    """The ReLU's backward (in place or not) writes the gradient of its input while the one it
    received is still alive; the first Linear makes its weight and bias gradients while the
    gradient of its output is. The memory model lets go of what a backward consumes at its
    start and charges what it makes at its end, so that overlap is each one's transient."""
    g = from_torch(nn.Sequential(nn.Linear(16, 32), nn.ReLU(inplace=inplace), nn.Linear(32, 4)),
                   torch.randn(8, 16))
    assert g.units["bwd_tmp_bytes"].tolist() == [8 * 32 * 4, 8 * 32 * 4, 0]


def test_frozen_parameters_are_not_trainable_bytes():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    model[0].requires_grad_(False)
    g = from_torch(model, torch.randn(2, 4))
    assert g.units.loc["0", "trainable_bytes"] == 0
    assert g.units.loc["1", "trainable_bytes"] == g.units.loc["1", "param_bytes"] == 80


def test_degrees_follow_channels_sequence_and_heads():
    torch.manual_seed(0)
    conv = from_torch(*CASES["residual"]()).units
    assert conv.loc["stem", ["max_parameter_degree", "max_attribute_degree"]].tolist() == [8, 16]
    assert conv.loc["blocks.0.relu", "max_parameter_degree"] == 1      # no parameters
    attn = from_torch(*CASES["attention"]()).units
    assert attn.loc["qkv", ["max_parameter_degree", "max_attribute_degree"]].tolist() == [96, 10]
    assert attn.loc["<root>", "max_parameter_degree"] == 4              # heads
    rnn = from_torch(Recurrent(), torch.randint(0, 50, (3, 7))).units
    assert rnn.loc["rnn", ["max_parameter_degree", "max_attribute_degree"]].tolist() == [24, 1]


def test_shard_axis_says_which_modules_export_can_slice():
    torch.manual_seed(0)
    conv = from_torch(*CASES["residual"]()).units
    assert conv.loc["stem", "shard_axis"] == 0 and conv.loc["blocks.0.relu", "shard_axis"] == -1
    attn = from_torch(*CASES["attention"]()).units
    assert attn.loc["qkv", "shard_axis"] == 0
    assert attn.loc["<root>", "shard_axis"] == -1        # glue of the root: not a module call


def test_tensor_rows_provenance_and_flags():
    torch.manual_seed(0)
    model, x = CASES["attention"]()
    g = from_torch(model, x)
    t = g.tensors
    model_input = t[t["producer"] == "<input>"].iloc[0]
    assert model_input["per_sample"] and not model_input["requires_grad"]
    assert model_input["consumers"] == ["qkv"] and model_input["savers"] == ["qkv"]
    assert model_input["shape"] == [2, 10, 32]
    mask = t[t["dtype"] == "bool"]
    assert len(mask) and not mask["per_sample"].any()                  # built from ones
    out = t[t["is_output"]]
    assert len(out) == 1 and out.iloc[0]["producer"] == "out"
    assert t.loc[t["producer"] == "qkv", "requires_grad"].all()
    # Every row outlives its op: read by another unit, returned, or saved.
    kept = t.apply(lambda r: r["is_output"] or bool(r["savers"]) or
                   any(c != r["producer"] for c in r["consumers"]), axis=1)
    assert kept.all()


def test_meta_describes_the_capture():
    g = from_torch(nn.Linear(4, 2), {"input": torch.randn(3, 4)}, units="leaves",
                   name="tiny", autocast="bfloat16")
    assert g.meta["model"] == "tiny" and g.meta["batch_size"] == 3
    assert g.meta["backend"] == "cpu" and g.meta["autocast"] == "bfloat16"
    assert g.meta["units"] == "leaves" and g.meta["torch"] == torch.__version__
    assert g.meta["inputs"] == [{"name": "input", "shape": [3, 4], "dtype": "float32"}]
    assert g.names == ["<root>"] and g.units.loc["<root>", "dtype"] == "bfloat16"


def test_graph_round_trips_through_json(tmp_path):
    torch.manual_seed(0)
    g = from_torch(*CASES["branching"]())
    again = OpGraph.load(g.save(tmp_path / "g.json"))
    assert again.names == g.names
    assert (again.units["saved_bytes"] == g.units["saved_bytes"]).all()
    assert again.meta == g.meta


def test_the_model_is_left_as_it_was():
    torch.manual_seed(0)
    model, x = CASES["residual"]()
    model.eval()
    before = {k: (v.data_ptr(), v.clone()) for k, v in model.state_dict().items()}
    from_torch(model, x)
    after = model.state_dict()
    assert not model.training
    assert all(after[k].data_ptr() == ptr and torch.equal(after[k], v)
               for k, (ptr, v) in before.items())
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_a_model_bigger_than_memory_captures_without_allocating():
    width, depth = 50_000, 5                  # 5 x 2.5e9 parameters: 50 GB in float32
    with torch.device("meta"):
        model = nn.Sequential(*(nn.Linear(width, width) for _ in range(depth)))
        x = torch.empty(8, width)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    g = from_torch(model, x)
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert g.units["param_bytes"].sum() == depth * (width * width + width) * 4
    assert g.units["fwd_flops"].sum() == depth * 2 * 8 * width * width
    assert grown_kib < 512 * 1024                              # far below the 50 GB


def test_backend_and_autocast_names_are_validated():
    from memflow.errors import CaptureError

    with pytest.raises(CaptureError, match="backend='tpu' is unknown"):
        from_torch(nn.Linear(2, 2), torch.randn(1, 2), backend="tpu")
    with pytest.raises(CaptureError, match="autocast='half' is not supported"):
        from_torch(nn.Linear(2, 2), torch.randn(1, 2), autocast="half")


def test_tensors_made_for_a_gpu_inside_forward_are_captured():
    class Gpu(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            bias = torch.ones(4, device="cuda", requires_grad=True)
            return self.lin(x) * bias

    g = from_torch(Gpu(), torch.randn(2, 4))
    assert g.names == ["<root>", "lin", "<root>#2"]          # ones(); lin; the product
    assert g.units.loc["<root>#2", "saved_bytes"] == 2 * 4 * 4 + 4 * 4    # both operands
