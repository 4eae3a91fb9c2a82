"""AlexNet, VGG-16 and VGG-19, laid out as torchvision lays them out.

Each is ``features`` (an ``nn.Sequential`` of convolutions, in-place ReLUs and max-pools),
``avgpool`` (adaptive, so smaller images work: at least 63 pixels for AlexNet, 32 for VGG),
a flatten in ``forward``, and ``classifier`` (an ``nn.Sequential`` of Linear / ReLU /
Dropout). Module and parameter names match torchvision's, so its state dicts load.
``forward`` returns class logits ``(batch, num_classes)``. ``hidden`` (4096) is the width of
the classifier's hidden layers; it holds most of the parameters, so tests shrink it.

Sources: Krizhevsky et al., "One weird trick for parallelizing convolutional neural networks"
(2014; the single-tower AlexNet torchvision implements), 61,100,840 parameters; Simonyan &
Zisserman, "Very deep convolutional networks for large-scale image recognition" (ICLR 2015),
configurations D (VGG-16, 138,357,544 parameters) and E (VGG-19, 143,667,240), as in
``torchvision.models.alexnet`` / ``vgg16`` / ``vgg19``.

>>> model = AlexNet(num_classes=10, hidden=64)
>>> model(torch.randn(2, 3, 64, 64)).shape
torch.Size([2, 10])
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from .spec import ModelSpec, image_inputs

__all__ = ["AlexNet", "VGG", "VGG_CONFIGS", "SPECS"]

# Output channels of each 3x3 convolution; "M" is a 2x2 max-pool (Simonyan & Zisserman, Table 1).
VGG_CONFIGS: dict[str, tuple[int | str, ...]] = {
    "D": (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
          512, 512, 512, "M"),
    "E": (64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M",
          512, 512, 512, 512, "M"),
}


class _FeaturesClassifier(nn.Module):
    """features -> adaptive average pool -> flatten -> classifier (AlexNet and VGG)."""

    def __init__(self, features: nn.Sequential, pool: int, classifier: nn.Sequential):
        super().__init__()
        self.features = features
        self.avgpool = nn.AdaptiveAvgPool2d((pool, pool))
        self.classifier = classifier

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.avgpool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


class AlexNet(_FeaturesClassifier):
    """AlexNet as in torchvision: five convolutions, three fully connected layers."""

    def __init__(self, num_classes: int = 1000, dropout: float = 0.5, hidden: int = 4096):
        features = nn.Sequential(
            nn.Conv2d(3, 64, kernel_size=11, stride=4, padding=2), nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2),
            nn.Conv2d(64, 192, kernel_size=5, padding=2), nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2),
            nn.Conv2d(192, 384, kernel_size=3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(384, 256, kernel_size=3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(256, 256, kernel_size=3, padding=1), nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2),
        )
        classifier = nn.Sequential(
            nn.Dropout(dropout), nn.Linear(256 * 6 * 6, hidden), nn.ReLU(inplace=True),
            nn.Dropout(dropout), nn.Linear(hidden, hidden), nn.ReLU(inplace=True),
            nn.Linear(hidden, num_classes),
        )
        super().__init__(features, 6, classifier)


def _vgg_features(config: Sequence[int | str], batch_norm: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    channels = 3
    for v in config:
        if v == "M":
            layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
            continue
        layers.append(nn.Conv2d(channels, int(v), kernel_size=3, padding=1))
        if batch_norm:
            layers.append(nn.BatchNorm2d(int(v)))
        layers.append(nn.ReLU(inplace=True))
        channels = int(v)
    return nn.Sequential(*layers)


class VGG(_FeaturesClassifier):
    """VGG with a configuration from :data:`VGG_CONFIGS` (``batch_norm`` gives the _bn variants)."""

    def __init__(self, config: Sequence[int | str], num_classes: int = 1000,
                 dropout: float = 0.5, batch_norm: bool = False, hidden: int = 4096):
        classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, hidden), nn.ReLU(inplace=True), nn.Dropout(dropout),
            nn.Linear(hidden, hidden), nn.ReLU(inplace=True), nn.Dropout(dropout),
            nn.Linear(hidden, num_classes),
        )
        super().__init__(_vgg_features(config, batch_norm), 7, classifier)


def _vgg(config: str):
    def build(**options) -> VGG:
        return VGG(VGG_CONFIGS[config], **options)
    return build


_IMAGES = "images (batch, 3, image_size, image_size) float32; image_size 224"
_LOGITS = "logits (batch, num_classes)"

SPECS = (
    ModelSpec("alexnet", "vision", AlexNet, image_inputs,
              arch={"num_classes": 1000, "dropout": 0.5, "hidden": 4096}, data={"image_size": 224},
              batch_size=128, input=_IMAGES, output=_LOGITS,
              source="Krizhevsky 2014 (arXiv:1404.5997); torchvision.models.alexnet"),
    ModelSpec("vgg16", "vision", _vgg("D"), image_inputs,
              arch={"num_classes": 1000, "dropout": 0.5, "batch_norm": False, "hidden": 4096},
              data={"image_size": 224}, batch_size=64, input=_IMAGES, output=_LOGITS,
              source="Simonyan & Zisserman, ICLR 2015, config D; torchvision.models.vgg16"),
    ModelSpec("vgg19", "vision", _vgg("E"), image_inputs,
              arch={"num_classes": 1000, "dropout": 0.5, "batch_norm": False, "hidden": 4096},
              data={"image_size": 224}, batch_size=64, input=_IMAGES, output=_LOGITS,
              source="Simonyan & Zisserman, ICLR 2015, config E; torchvision.models.vgg19"),
)
