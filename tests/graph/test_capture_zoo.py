"""Every zoo model captures, and its saved bytes equal real CPU autograd's; the zoo's GPT layer
follows Korthikanti et al.'s ``sbh(34 + 5as/h)`` under CUDA's rules."""
import pytest
import torch

from memflow.graph.capture import from_torch
from memflow.graph.measure import saved_bytes

from capture_models import assert_matches_model

zoo = pytest.importorskip("memflow.zoo")
from memflow.zoo.llama import SPECS as LLAMAS, TINY as TINY_LLAMA  # noqa: E402

_IMAGES = {"num_classes": 10}
_TEXT = {"n_layer": 2, "hidden": 64, "n_head": 4, "vocab": 100, "seq_len": 16}
# Options that keep the real CPU run of each zoo model cheap.
SMALL = {
    "alexnet": dict(_IMAGES, hidden=64, image_size=64),
    "vgg16": dict(_IMAGES, hidden=64, image_size=32),
    "vgg19": dict(_IMAGES, hidden=64, image_size=32),
    "resnet50": dict(_IMAGES, width=4, image_size=32),
    "resnet101": dict(_IMAGES, width=4, image_size=32),
    "inception_v3": dict(_IMAGES, image_size=75, aux_logits=False),
    "googlenet": dict(_IMAGES, image_size=32),
    "gnmt": dict(vocab=100, hidden=32, n_layer=4, src_len=7, tgt_len=5),
    "biglstm": dict(vocab=100, embed=16, hidden=32, proj=8, seq_len=5),
    "mlp": dict(width=64),
    "chain": dict(width=64),
    **{spec.name: TINY_LLAMA for spec in LLAMAS},
}


def small(name: str) -> dict:
    return SMALL.get(name, _TEXT if name.startswith(("gpt2", "bert")) else {})


@pytest.mark.parametrize("name", zoo.names())
def test_zoo_saved_bytes_match_real_cpu_autograd(name):
    model, inputs = zoo.get(name, batch_size=2, device="cpu", **small(name))
    graph = from_torch(model, inputs)
    real = saved_bytes(model, inputs)
    assert abs(graph.units["saved_bytes"].sum() - real) <= 0.005 * real
    assert_matches_model(graph, model)


def test_zoo_graph_captures_on_meta():
    graph = zoo.graph("gpt2", batch_size=2, n_layer=2, seq_len=32, units="blocks")
    assert graph.meta["model"] == "gpt2"
    assert {"h.0", "h.1"} <= set(graph.names)


@pytest.mark.parametrize("s, b, h, a", [(128, 2, 256, 4), (256, 1, 512, 8), (64, 4, 384, 6)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpt_layer_activations_follow_korthikanti(s, b, h, a, dtype):
    # One transformer layer in 16-bit with dropout and CUDA's 1-byte masks keeps
    # sbh(34 + 5as/h) bytes (Korthikanti et al. 2022); capture adds only LayerNorm's
    # statistics, which the formula leaves out.
    model, ids = zoo.get("gpt2", batch_size=b, n_layer=1, hidden=h, n_head=a, seq_len=s,
                         vocab=1000)
    graph = from_torch(model.to(dtype), ids, backend="cuda", units=["h.0"])
    layer = graph.units.loc["h.0", "saved_bytes"]
    assert abs(layer / (s * b * h * (34 + 5 * a * s / h)) - 1) < 0.01
