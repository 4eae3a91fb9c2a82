"""Capture's bf16 pass (``OpGraph.bf16``, issues 14 and 18): under a bf16 precision the memory
model charges the program a bf16 strategy runs — checked against real bf16 runs, counted with
``saved_tensors_hooks`` (:func:`memflow.graph.measure.saved_bytes`), never against memflow."""
import pytest
import torch
from torch import nn

import memflow
from memflow.export.model_states import cast_inputs, cast_parameters, cast_statistics
from memflow.export.validation import predicted_held
from memflow.graph import OpGraph
from memflow.graph.measure import saved_bytes
from memflow.planners.batch import at_batch
from memflow.sim import Simulator
from memflow.strategy import Strategy

LLAMA = dict(vocab=40, hidden=16, n_layer=2, n_head=4, n_kv_head=2, ffn=24, seq_len=6)
RESNET = dict(num_classes=5, width=4, image_size=32, blocks=(1, 1, 1, 1))


def _real_bf16(name: str, batch: int, **cfg) -> tuple[nn.Module, object]:
    """The zoo model as the exported script runs it under ``bf16``."""
    model, inputs = memflow.zoo.get(name, batch, device="cpu", **cfg)
    cast_parameters(model.parameters(), "bf16")
    cast_statistics(model, "bf16")
    return model, cast_inputs(inputs, "bf16")


def _held(g: OpGraph, precision: str | None) -> float:
    s = Strategy.single_device(g)
    return sum(predicted_held(g, s if precision is None else
                              s.with_model_states(precision=precision)).values())


@pytest.mark.parametrize("precision", ["bf16", "pure-bf16"])
def test_a_bf16_llama_holds_what_a_real_bf16_run_saves(precision):
    """RMSNorm computes in fp32: a real bf16 Llama saves an fp32 copy of each norm's input,
    which halving the fp32 capture missed (it predicted 26,160 bytes against 30,720)."""
    g = memflow.zoo.graph("tinyllama-1.1b", batch_size=4, units="blocks", **LLAMA)
    model, inputs = _real_bf16("tinyllama-1.1b", 4, **LLAMA)
    real = saved_bytes(model, inputs)
    assert _held(g, precision) == pytest.approx(real, rel=0.01)
    assert _held(g, precision) > _held(g, None) / 2      # more than half: the fp32 copies
    fp32 = g.bf16.tensors[g.bf16.tensors["dtype"] == "float32"]
    assert (fp32["savers"].str.len() > 0).any()          # saved in fp32 by the norms


def test_units_of_both_passes_agree_when_a_cast_adds_glue():
    """``.float()`` of the output is nothing in fp32 and an op in bf16, in the model's own
    code after its last child: the bf16 pass keeps it in the unit running before it."""
    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.norm = nn.Linear(8, 8), nn.LayerNorm(8)

        def forward(self, x):
            return self.norm(self.fc(x)).float()

    x = torch.randn(4, 8)
    g = memflow.from_torch(Head(), x)
    assert g.bf16 is not None and list(g.bf16.units.index) == g.names
    model = Head()
    cast_parameters(model.parameters(), "bf16")
    real = saved_bytes(model, cast_inputs(x, "bf16"))
    assert g.bf16.units["saved_bytes"].sum() == real


def test_batch_norm_statistics_are_charged_at_the_width_export_gives_them():
    """Export casts batch norms' running statistics to bf16; the simulator's weights under
    bf16 are the bytes of the cast model's parameters and buffers (resnet50 was -1.3% / -3.4%
    per stage with buffers charged at fp32)."""
    g = memflow.zoo.graph("resnet50", batch_size=8, units="blocks", **RESNET)
    stats = g.parameters["name"].str.endswith(("running_mean", "running_var"))
    assert (g.bf16.parameters.loc[stats, "dtype"] == "bfloat16").all()
    assert (g.bf16.parameters.loc[stats, "bytes"] * 2 == g.parameters.loc[stats, "bytes"]).all()
    counter = g.parameters["name"].str.endswith("num_batches_tracked")
    assert (g.bf16.parameters.loc[counter, "bytes"] == g.parameters.loc[counter, "bytes"]).all()
    model, _ = _real_bf16("resnet50", 8, **RESNET)
    real = sum(t.nbytes for t in [*model.parameters(), *model.buffers()])
    s = Strategy.single_device(g).with_model_states(precision="bf16")
    states = Simulator(g, memflow.Cluster.preset("1xV100-16GB")).result(s).model_states
    assert float(states["weights"].sum()) == real


def test_the_bf16_pass_survives_files_and_batch_scaling(tmp_path):
    g = memflow.zoo.graph("tinyllama-1.1b", batch_size=4, units="blocks", **LLAMA)
    back = OpGraph.load(g.save(tmp_path / "g.json"))
    assert back.bf16 is not None
    assert back.bf16.tensors["bytes"].tolist() == g.bf16.tensors["bytes"].tolist()
    assert back.bf16.parameters["bytes"].tolist() == g.bf16.parameters["bytes"].tolist()
    g8 = at_batch(g, 8)
    assert g8.bf16.tensors["bytes"].sum() > g.bf16.tensors["bytes"].sum()


def test_without_the_pass_bf16_halves_the_fp32_activations():
    model, x = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)), torch.randn(4, 8)
    g = memflow.from_torch(model, x, bf16=False)
    assert g.bf16 is None
    assert _held(g, "bf16") == _held(g, None) / 2
    assert memflow.from_torch(model, x, autocast="bfloat16").bf16 is None


def test_a_model_that_cannot_run_in_bf16_is_captured_with_a_warning():
    """A mask made in float32 times a bf16 activation fails in a real bf16 run as in the
    pass: the graph has no bf16 pass, and bf16 precisions halve (the export would fail)."""
    class Masked(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return torch.ones(1, 4, 4, dtype=torch.float32) @ self.fc(x)[None]

    with pytest.warns(UserWarning, match="does not run with its parameters and inputs in"):
        g = memflow.from_torch(Masked(), torch.randn(4, 4))
    assert g.bf16 is None and g.names == ["<root>", "fc", "<root>#2"]
