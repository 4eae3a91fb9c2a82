"""Small synthetic models: a multilayer perceptron and a chain of ``n`` layers.

**chain** (:class:`Chain`) is the test bed of checkpointing and search: ``n`` layers in the
``nn.ModuleList`` ``layers``, run one after the other, so that ``units="blocks"`` gives exactly
``n`` units in a line (a *chain*, as rotor and Chen et al.'s sqrt(n) checkpointing assume).

* ``kind="mlp"``: layer ``i`` is a :class:`Dense` ``Linear(w[i-1], w[i]) -> ReLU`` (``w[-1]``
  is the input ``width``); the output has ``widths[-1]`` features.
* ``kind="residual"``: layer ``i`` is a :class:`Residual` ``x + Linear(w[i], width)(ReLU(
  Linear(width, w[i])(x)))``; the output has ``width`` features. ``n=1000`` is the deep
  residual chain of Chen et al.'s "Training deep nets with sublinear memory cost" (2016).

The layer widths ``w`` are ``widths`` when given (``n`` integers), else drawn from
``width_seed`` — log-uniformly between ``width / 4`` and ``4 * width``, multiples of 8 — so that
layer costs differ, else all equal to ``width``. The input is ``(batch, width)``.

**mlp** (:class:`MLP`) is ``n_layer`` Dense layers of ``width`` on flattened 28x28 images
(784 features, MNIST-shaped) and a Linear classifier: logits ``(batch, num_classes)``.

>>> Chain(n=3, width=16, widths=(8, 32, 4))(torch.randn(2, 16)).shape
torch.Size([2, 4])
>>> layer_widths(4, 64, width_seed=1)
[24, 168, 136, 32]
"""
from __future__ import annotations

import random
from typing import Sequence

import torch
from torch import nn

from ..errors import MemflowError
from .spec import ModelSpec

__all__ = ["Dense", "Residual", "Chain", "MLP", "layer_widths", "SPECS"]

KINDS = ("mlp", "residual")


class Dense(nn.Module):
    """``Linear`` then ``ReLU``."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.fc(x))


class Residual(nn.Module):
    """``x + fc2(relu(fc1(x)))`` with an inner width ``hidden``."""

    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(width, hidden)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.relu(self.fc1(x)))


def layer_widths(n: int, width: int, widths: Sequence[int] | None = None,
                 width_seed: int | None = None) -> list[int]:
    """The ``n`` layer widths of a chain: ``widths``, or seeded random ones, or ``width``."""
    if n < 1 or width < 1:
        raise MemflowError(f"chain needs n >= 1 and width >= 1, got n={n}, width={width}")
    if widths is not None:
        if len(widths) != n or min(widths) < 1:
            raise MemflowError(f"chain widths={list(widths)} must be {n} positive integers "
                               f"(one per layer, n={n})")
        return [int(w) for w in widths]
    if width_seed is None:
        return [width] * n
    rng = random.Random(width_seed)
    return [max(8, round(width * 2 ** rng.uniform(-2, 2) / 8) * 8) for _ in range(n)]


class Chain(nn.Module):
    """``n`` Dense or Residual layers in a line (see the module docstring)."""

    def __init__(self, n: int = 10, width: int = 1024, kind: str = "mlp",
                 widths: Sequence[int] | None = None, width_seed: int | None = None):
        super().__init__()
        if kind not in KINDS:
            raise MemflowError(f"chain kind={kind!r} is unknown; valid: {', '.join(KINDS)}")
        self.in_features = width
        sizes = layer_widths(n, width, widths, width_seed)
        if kind == "mlp":
            self.layers = nn.ModuleList(Dense(a, b) for a, b in zip([width] + sizes, sizes))
        else:
            self.layers = nn.ModuleList(Residual(width, h) for h in sizes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class MLP(nn.Module):
    """``n_layer`` Dense layers of ``width``, then a Linear ``head`` to the classes."""

    def __init__(self, in_features: int = 784, width: int = 1024, n_layer: int = 3,
                 num_classes: int = 10):
        super().__init__()
        self.in_features = in_features
        self.layers = nn.Sequential(*(Dense(in_features if i == 0 else width, width)
                                      for i in range(n_layer)))
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layers(x))


def vector_inputs(model: nn.Module, batch_size: int) -> tuple[torch.Tensor]:
    """One batch of feature vectors, ``(batch, model.in_features)`` float.

    >>> vector_inputs(MLP(in_features=12), 3)[0].shape
    torch.Size([3, 12])
    """
    return (torch.randn(batch_size, model.in_features),)


SPECS = (
    ModelSpec("mlp", "basic", MLP, vector_inputs,
              arch={"in_features": 784, "width": 1024, "n_layer": 3, "num_classes": 10},
              data={}, batch_size=64, input="features (batch, in_features) float32; 784",
              output="logits (batch, num_classes)",
              source="synthetic multilayer perceptron (MNIST-shaped input)"),
    ModelSpec("chain", "basic", Chain, vector_inputs,
              arch={"n": 10, "width": 1024, "kind": "mlp", "widths": None, "width_seed": None},
              data={}, batch_size=64, input="features (batch, width) float32; 1024",
              output="features (batch, last width) for mlp, (batch, width) for residual",
              source="synthetic chain; residual n=1000: Chen et al. 2016 (arXiv:1604.06174)"),
)
