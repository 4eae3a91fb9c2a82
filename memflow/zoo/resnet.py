"""ResNet-50 and ResNet-101 with bottleneck blocks, named as torchvision names them.

The stem is ``conv1``, ``bn1``, ``relu``, ``maxpool``; the four stages ``layer1`` .. ``layer4``
are ``nn.Sequential`` s of :class:`Bottleneck` blocks (so ``units="blocks"`` finds them); then
``avgpool`` and ``fc``. A bottleneck has ``conv1``/``bn1``, ``conv2``/``bn2`` (stride here:
ResNet v1.5, as torchvision), ``conv3``/``bn3`` and, where the shape changes, ``downsample``.

One deliberate difference: torchvision's bottleneck calls a single ``relu`` module three
times; here each position has its own instance, ``relu1``, ``relu2``, ``relu3`` (the last
after the residual add), so every ReLU is a unit of its own with a plain name instead of
``relu#2`` / ``relu#3``. ReLUs hold no parameters, so torchvision state dicts still load.
ReLUs are in place, as in torchvision, because in-place ops change what autograd saves.

``forward`` returns class logits ``(batch, num_classes)``.

Source: He et al., "Deep residual learning for image recognition" (CVPR 2016), Table 1;
``torchvision.models.resnet50`` (25,557,032 parameters) and ``resnet101`` (44,549,160).

>>> model = ResNet((1, 1, 1, 1), width=8, num_classes=10)
>>> model(torch.randn(2, 3, 32, 32)).shape
torch.Size([2, 10])
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from .spec import ModelSpec, image_inputs

__all__ = ["Bottleneck", "ResNet", "SPECS"]


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (strided), 1x1 expand by 4, plus the identity or a projection."""

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1):
        super().__init__()
        out = planes * self.expansion
        self.conv1 = nn.Conv2d(inplanes, planes, kernel_size=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu1 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu2 = nn.ReLU(inplace=True)
        self.conv3 = nn.Conv2d(planes, out, kernel_size=1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.relu3 = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or inplanes != out:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, out, kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.relu1(self.bn1(self.conv1(x)))
        y = self.relu2(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        # torchvision's order: the projection runs after the main branch.
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu3(y + identity)


class ResNet(nn.Module):
    """A bottleneck ResNet: ``blocks`` per stage, stage widths ``width`` x (1, 2, 4, 8)."""

    def __init__(self, blocks: Sequence[int], num_classes: int = 1000, width: int = 64):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        inplanes = width
        for i, count in enumerate(blocks):
            planes = width * 2 ** i
            stride = 1 if i == 0 else 2
            stage = [Bottleneck(inplanes, planes, stride)]
            inplanes = planes * Bottleneck.expansion
            stage += [Bottleneck(inplanes, planes) for _ in range(count - 1)]
            self.add_module(f"layer{i + 1}", nn.Sequential(*stage))
        self.n_stages = len(blocks)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(inplanes, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        for i in range(self.n_stages):
            x = getattr(self, f"layer{i + 1}")(x)
        return self.fc(torch.flatten(self.avgpool(x), 1))


_IMAGES = "images (batch, 3, image_size, image_size) float32; image_size 224"
_LOGITS = "logits (batch, num_classes)"

SPECS = (
    ModelSpec("resnet50", "resnet", ResNet, image_inputs,
              arch={"num_classes": 1000, "width": 64, "blocks": (3, 4, 6, 3)},
              data={"image_size": 224}, batch_size=32, input=_IMAGES, output=_LOGITS,
              source="He et al., CVPR 2016; torchvision.models.resnet50"),
    ModelSpec("resnet101", "resnet", ResNet, image_inputs,
              arch={"num_classes": 1000, "width": 64, "blocks": (3, 4, 23, 3)},
              data={"image_size": 224}, batch_size=32, input=_IMAGES, output=_LOGITS,
              source="He et al., CVPR 2016; torchvision.models.resnet101"),
)
