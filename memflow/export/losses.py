"""The loss an exported training script computes (``--loss``: ``auto``, ``cross_entropy`` or
``mse``), and the same loss as capture's ``loss_fn`` (:func:`capture_loss`), so that the graph
memflow predicts from is the step the script runs.

A language model's logits make the loss matter: cross entropy keeps its float32 log-softmax
for backward and writes a gradient as large as the logits (on an H200, GPT-2 at 8 × 1024
tokens held 3 GB more than a capture whose backward began from the sum of the outputs).

>>> import torch
>>> loss = capture_loss()
>>> float(loss(torch.zeros(2, 4)))            # cross entropy over 4 classes, class 0 drawn
1.3862943649291992
>>> float(capture_loss("mse")(torch.ones(3)))
1.0
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch.utils import _pytree as pytree

__all__ = ["LOSSES", "first_float", "loss_kind", "loss_of", "capture_loss"]

LOSSES = ("auto", "cross_entropy", "mse")
"""The losses a script computes; ``auto``: cross entropy over the last dimension of an output
of two dimensions or more, else mean squared error."""


def first_float(output) -> torch.Tensor:
    """The first floating tensor of a model's ``output`` (what the loss is computed on)."""
    for t in pytree.tree_leaves(output):
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            return t
    raise TypeError(f"the model returned no floating tensor to train on: {type(output)}")


def loss_kind(kind: str, out: torch.Tensor) -> str:
    """``kind`` with ``auto`` resolved for the output ``out``."""
    if kind == "auto":
        return "cross_entropy" if out.dim() >= 2 else "mse"
    return kind


def loss_of(kind: str, output, target: torch.Tensor | None, seed: int) -> tuple:
    """The loss, and the target (drawn once from ``seed`` when not given)."""
    out = first_float(output)
    kind = loss_kind(kind, out)
    if target is None:
        g = torch.Generator().manual_seed(seed)
        target = (torch.randint(0, out.shape[-1], out.shape[:-1], generator=g)
                  if kind == "cross_entropy" else torch.randn(out.shape, generator=g))
        target = target.to(out.device)
    if kind == "cross_entropy":
        return F.cross_entropy(out.reshape(-1, out.shape[-1]).float(), target.reshape(-1)), target
    return F.mse_loss(out.float(), target), target


def capture_loss(kind: str = "auto") -> Callable[[object], torch.Tensor]:
    """The script's loss ``kind`` as capture's ``loss_fn(output)``: the same operations on a
    target of the same shape and dtype (zeros: capture runs on fake tensors, where the values
    do not matter)."""
    if kind not in LOSSES:
        raise ValueError(f"loss {kind!r} is unknown; valid: {', '.join(LOSSES)}")

    def loss(output) -> torch.Tensor:
        out = first_float(output)
        resolved = loss_kind(kind, out)
        target = (out.new_zeros(out.shape[:-1], dtype=torch.long)
                  if resolved == "cross_entropy" else torch.zeros_like(out))
        return loss_of(resolved, output, target, 0)[0]
    return loss
