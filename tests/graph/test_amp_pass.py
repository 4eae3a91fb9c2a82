"""Capture's amp pass (``OpGraph.amp``): an ``amp`` strategy on an ordinary fp32 capture is
charged what float16 autocast really saves — autocast's half copies of the weights (one per
weight and step: its cache), fp16 outputs of its lower-precision ops, fp32 where it runs in
fp32 — checked against real autocast runs on the CPU, counted with ``saved_tensors_hooks``
(:func:`memflow.graph.measure.saved_bytes`), never against memflow."""
import pytest
import torch
from torch import nn

import memflow
from memflow.export.validation import predicted_held
from memflow.graph import OpGraph
from memflow.graph.measure import saved_bytes
from memflow.planners.batch import at_batch
from memflow.strategy import Strategy

LLAMA = dict(vocab=40, hidden=16, n_layer=2, n_head=4, n_kv_head=2, ffn=24, seq_len=6)
RESNET = dict(num_classes=5, width=4, image_size=32, blocks=(1, 1, 1, 1))
GPT2 = dict(vocab=40, max_positions=16, hidden=16, n_layer=1, n_head=2, seq_len=6)


def _held(g: OpGraph, precision: str | None) -> float:
    s = Strategy.single_device(g)
    return sum(predicted_held(g, s if precision is None else
                              s.with_model_states(precision=precision)).values())


@pytest.mark.parametrize("name,batch,cfg,units", [
    ("chain", 4, dict(n=3, width=8), "leaves"),
    ("mlp", 4, {}, "leaves"),
    ("gpt2", 2, GPT2, "leaves"),
    ("resnet50", 4, RESNET, "blocks"),
    ("tinyllama-1.1b", 4, LLAMA, "blocks"),
])
def test_amp_holds_what_a_real_autocast_step_saves(name, batch, cfg, units):
    model, inputs = memflow.zoo.get(name, batch, device="cpu", **cfg)
    real = saved_bytes(model, inputs, autocast="float16")
    g = memflow.from_torch(model, inputs, units=units)
    assert g.amp is not None and list(g.amp.units.index) == g.names
    assert _held(g, "amp") == real


def test_autocast_copies_a_weight_once_however_often_it_runs():
    """A module called twice reads one cached half copy of its weight (autocast's cache);
    the copies are what make mlp's amp step save 69 times its fp32 step at batch 4."""
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.out = nn.Linear(64, 64), nn.Linear(64, 4)

        def forward(self, x):
            return self.out(torch.relu(self.fc(torch.relu(self.fc(x)))))

    model, x = Twice(), torch.randn(4, 64)
    g = memflow.from_torch(model, x)
    assert _held(g, "amp") == saved_bytes(model, x, autocast="float16")
    half = g.amp.tensors[(g.amp.tensors["dtype"] == "float16") & ~g.amp.tensors["per_sample"]]
    assert (half["bytes"] == 64 * 64 * 2).sum() == 1          # fc's weight, copied once


def test_the_amp_pass_survives_files_and_batch_scaling(tmp_path):
    g = memflow.zoo.graph("gpt2", batch_size=2, **GPT2)
    back = OpGraph.load(g.save(tmp_path / "g.json"))
    assert back.amp.tensors["bytes"].tolist() == g.amp.tensors["bytes"].tolist()
    g4 = at_batch(g, 4)
    model, inputs = memflow.zoo.get("gpt2", 4, device="cpu", **GPT2)
    assert _held(g4, "amp") == saved_bytes(model, inputs, autocast="float16")


def test_without_the_pass_amp_keeps_the_capture_and_an_autocast_capture_is_its_own():
    model, x = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)), torch.randn(4, 8)
    g = memflow.from_torch(model, x, amp=False)
    assert g.amp is None and _held(g, "amp") == _held(g, None)
    under = memflow.from_torch(model, x, autocast="float16")
    assert under.amp is None and _held(under, "amp") == saved_bytes(model, x, autocast="float16")
