"""Models, strategies and gradient checks shared by the export tests."""
from __future__ import annotations

import functools
import importlib.util
import random
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn
from torch.utils import _pytree as pytree

import memflow
from memflow import zoo
from memflow.graph.capture import split_inputs
from memflow.strategy import Strategy
from memflow.zoo import llama

_TEXT = {"n_layer": 2, "hidden": 16, "n_head": 2, "vocab": 40, "seq_len": 6}
# Every zoo model, shrunk until a real CPU step takes a fraction of a second.
ZOO = {
    "alexnet": dict(num_classes=5, hidden=16, image_size=64),
    "vgg16": dict(num_classes=5, hidden=16, image_size=32),
    "vgg19": dict(num_classes=5, hidden=16, image_size=32),
    "resnet50": dict(num_classes=5, width=4, image_size=32, blocks=(1, 2, 1, 1)),
    "resnet101": dict(num_classes=5, width=4, image_size=32, blocks=(1, 1, 2, 1)),
    "inception_v3": dict(num_classes=5, image_size=75, aux_logits=False),
    "googlenet": dict(num_classes=5, image_size=32),
    "gnmt": dict(vocab=40, hidden=16, n_layer=4, src_len=5, tgt_len=4),
    "biglstm": dict(vocab=40, embed=8, hidden=16, proj=8, seq_len=4),
    "mlp": dict(in_features=24, width=16, n_layer=2),
    "chain": dict(n=4, width=16, kind="residual"),
    **{spec.name: llama.TINY for spec in llama.SPECS},
}


def zoo_small(name: str) -> dict:
    return ZOO.get(name, _TEXT)


def zoo_model(name: str) -> tuple[nn.Module, Any]:
    return zoo.get(name, batch_size=2, device="cpu", **zoo_small(name))


def _capture_models(module: str = "capture_models"):
    """The foundation issue's varied real models (tests/graph/capture_models.py), or another
    module of tests/graph (``hf_models``: tiny Hugging Face models from their configs)."""
    path = Path(__file__).parents[1] / "graph" / f"{module}.py"
    spec = importlib.util.spec_from_file_location(module, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class InPlace(nn.Module):
    """Tied embedding and head; glue writes tensors in place (and can be trained: the
    foundation's ``tied-inplace`` model writes a tanh output that tanh saves)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.norm = nn.LayerNorm(16)
        self.act = nn.ReLU(inplace=True)
        self.head = nn.Linear(16, 50, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        x.mul_(2.0)
        x = (x * 3).add_(1.0)
        return self.head(self.act(self.norm(x)))


@functools.cache
def real_cases() -> dict[str, Callable[[], tuple[nn.Module, Any]]]:
    cases = dict(_capture_models().CASES)
    # Its backward fails in plain PyTorch (tanh's saved output is written in place).
    cases.pop("tied-inplace")
    cases["inplace-tied"] = lambda: (InPlace(), torch.randint(0, 50, (3, 7)))
    return cases


def build(name: str) -> tuple[nn.Module, Any]:
    """``(model, example_inputs)`` of a zoo name or a real case; seeded, training mode."""
    torch.manual_seed(0)
    if name in zoo.names():
        return zoo_model(name)
    return real_cases()[name]()


@functools.cache
def captured(name: str, units: Any = "leaves"):
    model, inputs = build(name)
    return model, inputs, memflow.from_torch(model, inputs, units=units)


def mixed(graph, seed: int = 0, policies=("keep", "recompute", "offload")) -> Strategy:
    """A seeded random mix of ``policies`` over the units of ``graph``."""
    rng = random.Random(seed)
    s = Strategy.single_device(graph, name=f"mix {seed}").with_policy(
        {u: rng.choice(policies) for u in graph.names})
    return s


def grads(model: nn.Module, inputs: Any, seed: int = 0) -> dict[str, torch.Tensor]:
    """Parameter gradients of ``sum(mean(out²))`` after one forward from RNG ``seed``."""
    args, kwargs = split_inputs(inputs)
    torch.manual_seed(seed)
    out = model(*args, **kwargs)
    loss = sum(t.float().pow(2).mean() for t in pytree.tree_leaves(out)
               if isinstance(t, torch.Tensor) and t.requires_grad)
    loss.backward()
    found = {n.removeprefix("module."): p.grad.clone() for n, p in model.named_parameters()
             if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return found


def mismatches(reference: dict, other: dict, atol: float = 0.0, rtol: float = 0.0) -> list:
    """Names whose gradients differ (exactly, or beyond the tolerances)."""
    assert reference.keys() == other.keys()
    return [k for k in reference
            if not (torch.equal(reference[k], other[k]) if atol == rtol == 0
                    else torch.allclose(reference[k], other[k], atol=atol, rtol=rtol))]
