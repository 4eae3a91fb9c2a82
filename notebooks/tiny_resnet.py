"""A small residual network and a batch for it: the "your model" of ``04_export_and_validate``.

``make(batch_size=..., seed=...)`` returns ``(model, example_inputs)`` as
:func:`memflow.zoo.get` does, so memflow's exported training script can build the model from
this file (``memflow.export.script(..., model="notebooks/tiny_resnet.py:make")``).
"""
from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    """conv-bn-relu-conv-bn plus the input (a residual block)."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.bn2(self.conv2(y)))


class TinyResNet(nn.Module):
    """A stem, ``depth`` residual blocks at one width, global pooling and a classifier."""

    def __init__(self, width: int = 32, depth: int = 4, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(width), nn.ReLU())
        self.blocks = nn.Sequential(*(Block(width) for _ in range(depth)))
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)).mean(dim=(2, 3)))


def make(batch_size: int = 64, seed: int = 0, image_size: int = 32, **options):
    """``(model, (images,))`` on CPU, weights and images drawn from ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = TinyResNet(**options)
    images = torch.randn(batch_size, 3, image_size, image_size, generator=gen)
    return model.train(), (images,)
