"""Inception-v3 and GoogLeNet (Inception-v1), module for module as torchvision builds them.

Both are built from :class:`BasicConv2d` (convolution without bias, BatchNorm with eps 0.001,
in-place ReLU). torchvision applies that ReLU functionally; here it is a module ``relu`` so that
it is a unit of its own. Parameter names match torchvision's, so its state dicts load. Pooling
inside a block and the concatenation of branches are the block's own code (glue).

Auxiliary classifiers, and so the outputs, follow torchvision's defaults and published
parameter counts:

* ``inception_v3`` keeps its auxiliary head (``aux_logits=True``): 27,161,264 parameters
  (23,834,568 with ``aux_logits=False``). In training mode ``forward`` returns the tuple
  ``(logits, aux_logits)``, both ``(batch, num_classes)``, as torchvision's
  ``InceptionOutputs``; in eval mode, or without the head, the logits alone. A training loss
  uses both (torchvision's reference weighs the auxiliary loss by 0.4).
* ``googlenet`` has no auxiliary heads by default (``aux_logits=False``): 6,624,904
  parameters, the count of torchvision's published weights, and ``forward`` returns the logits.
  With ``aux_logits=True`` training mode returns ``(logits, aux2, aux1)`` as torchvision does.

Inception-v3's auxiliary head needs a 17x17 map after ``Mixed_6e``, hence 299-pixel images;
without it any image of at least 75 pixels works.

Sources: Szegedy et al., "Rethinking the Inception architecture for computer vision"
(CVPR 2016) and "Going deeper with convolutions" (CVPR 2015);
``torchvision.models.inception_v3`` and ``torchvision.models.googlenet`` (whose ``branch3``
uses a 3x3 convolution where the paper has 5x5 — kept, so the count and the weights match).

>>> model = GoogLeNet(num_classes=10)
>>> model(torch.randn(2, 3, 32, 32)).shape
torch.Size([2, 10])
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .spec import ModelSpec, image_inputs

__all__ = ["BasicConv2d", "Inception3", "GoogLeNet", "SPECS"]

Output = torch.Tensor | tuple[torch.Tensor, ...]


class BasicConv2d(nn.Module):
    """Convolution (no bias) -> BatchNorm (eps 0.001) -> in-place ReLU."""

    def __init__(self, in_channels: int, out_channels: int, **conv):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, bias=False, **conv)
        self.bn = nn.BatchNorm2d(out_channels, eps=0.001)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.bn(self.conv(x)))


def _avg3(x: torch.Tensor) -> torch.Tensor:
    # The pooling branch of every Inception-v3 block that keeps the spatial size.
    return F.avg_pool2d(x, kernel_size=3, stride=1, padding=1)


def _max3(x: torch.Tensor) -> torch.Tensor:
    # The pooling branch of the grid-reduction blocks (B and D).
    return F.max_pool2d(x, kernel_size=3, stride=2)


class InceptionA(nn.Module):
    """35x35 block: 1x1, 5x5, double 3x3 and pooling branches."""

    def __init__(self, c: int, pool_features: int):
        super().__init__()
        self.branch1x1 = BasicConv2d(c, 64, kernel_size=1)
        self.branch5x5_1 = BasicConv2d(c, 48, kernel_size=1)
        self.branch5x5_2 = BasicConv2d(48, 64, kernel_size=5, padding=2)
        self.branch3x3dbl_1 = BasicConv2d(c, 64, kernel_size=1)
        self.branch3x3dbl_2 = BasicConv2d(64, 96, kernel_size=3, padding=1)
        self.branch3x3dbl_3 = BasicConv2d(96, 96, kernel_size=3, padding=1)
        self.branch_pool = BasicConv2d(c, pool_features, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b1 = self.branch1x1(x)
        b5 = self.branch5x5_2(self.branch5x5_1(x))
        b3 = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
        return torch.cat([b1, b5, b3, self.branch_pool(_avg3(x))], 1)


class InceptionB(nn.Module):
    """Grid reduction 35x35 -> 17x17."""

    def __init__(self, c: int):
        super().__init__()
        self.branch3x3 = BasicConv2d(c, 384, kernel_size=3, stride=2)
        self.branch3x3dbl_1 = BasicConv2d(c, 64, kernel_size=1)
        self.branch3x3dbl_2 = BasicConv2d(64, 96, kernel_size=3, padding=1)
        self.branch3x3dbl_3 = BasicConv2d(96, 96, kernel_size=3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b3 = self.branch3x3(x)
        bd = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
        return torch.cat([b3, bd, _max3(x)], 1)


class InceptionC(nn.Module):
    """17x17 block with factorized 7x7 convolutions (1x7 then 7x1) of ``c7`` channels."""

    def __init__(self, c: int, c7: int):
        super().__init__()
        row = {"kernel_size": (1, 7), "padding": (0, 3)}
        col = {"kernel_size": (7, 1), "padding": (3, 0)}
        self.branch1x1 = BasicConv2d(c, 192, kernel_size=1)
        self.branch7x7_1 = BasicConv2d(c, c7, kernel_size=1)
        self.branch7x7_2 = BasicConv2d(c7, c7, **row)
        self.branch7x7_3 = BasicConv2d(c7, 192, **col)
        self.branch7x7dbl_1 = BasicConv2d(c, c7, kernel_size=1)
        self.branch7x7dbl_2 = BasicConv2d(c7, c7, **col)
        self.branch7x7dbl_3 = BasicConv2d(c7, c7, **row)
        self.branch7x7dbl_4 = BasicConv2d(c7, c7, **col)
        self.branch7x7dbl_5 = BasicConv2d(c7, 192, **row)
        self.branch_pool = BasicConv2d(c, 192, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b1 = self.branch1x1(x)
        b7 = self.branch7x7_3(self.branch7x7_2(self.branch7x7_1(x)))
        bd = x
        for i in range(1, 6):
            bd = getattr(self, f"branch7x7dbl_{i}")(bd)
        return torch.cat([b1, b7, bd, self.branch_pool(_avg3(x))], 1)


class InceptionD(nn.Module):
    """Grid reduction 17x17 -> 8x8."""

    def __init__(self, c: int):
        super().__init__()
        self.branch3x3_1 = BasicConv2d(c, 192, kernel_size=1)
        self.branch3x3_2 = BasicConv2d(192, 320, kernel_size=3, stride=2)
        self.branch7x7x3_1 = BasicConv2d(c, 192, kernel_size=1)
        self.branch7x7x3_2 = BasicConv2d(192, 192, kernel_size=(1, 7), padding=(0, 3))
        self.branch7x7x3_3 = BasicConv2d(192, 192, kernel_size=(7, 1), padding=(3, 0))
        self.branch7x7x3_4 = BasicConv2d(192, 192, kernel_size=3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b3 = self.branch3x3_2(self.branch3x3_1(x))
        b7 = x
        for i in range(1, 5):
            b7 = getattr(self, f"branch7x7x3_{i}")(b7)
        return torch.cat([b3, b7, _max3(x)], 1)


class InceptionE(nn.Module):
    """8x8 block whose 3x3 branches split into parallel 1x3 and 3x1 convolutions."""

    def __init__(self, c: int):
        super().__init__()
        row = {"kernel_size": (1, 3), "padding": (0, 1)}
        col = {"kernel_size": (3, 1), "padding": (1, 0)}
        self.branch1x1 = BasicConv2d(c, 320, kernel_size=1)
        self.branch3x3_1 = BasicConv2d(c, 384, kernel_size=1)
        self.branch3x3_2a = BasicConv2d(384, 384, **row)
        self.branch3x3_2b = BasicConv2d(384, 384, **col)
        self.branch3x3dbl_1 = BasicConv2d(c, 448, kernel_size=1)
        self.branch3x3dbl_2 = BasicConv2d(448, 384, kernel_size=3, padding=1)
        self.branch3x3dbl_3a = BasicConv2d(384, 384, **row)
        self.branch3x3dbl_3b = BasicConv2d(384, 384, **col)
        self.branch_pool = BasicConv2d(c, 192, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b1 = self.branch1x1(x)
        b3 = self.branch3x3_1(x)
        b3 = torch.cat([self.branch3x3_2a(b3), self.branch3x3_2b(b3)], 1)
        bd = self.branch3x3dbl_2(self.branch3x3dbl_1(x))
        bd = torch.cat([self.branch3x3dbl_3a(bd), self.branch3x3dbl_3b(bd)], 1)
        return torch.cat([b1, b3, bd, self.branch_pool(_avg3(x))], 1)


class InceptionAux(nn.Module):
    """Inception-v3's auxiliary classifier on the 17x17x768 map."""

    def __init__(self, c: int, num_classes: int):
        super().__init__()
        self.conv0 = BasicConv2d(c, 128, kernel_size=1)
        self.conv1 = BasicConv2d(128, 768, kernel_size=5)
        self.fc = nn.Linear(768, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(self.conv0(F.avg_pool2d(x, kernel_size=5, stride=3)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, (1, 1)), 1))


class Inception3(nn.Module):
    """Inception-v3 (torchvision's ``Inception3`` with ``transform_input=False``)."""

    def __init__(self, num_classes: int = 1000, aux_logits: bool = True, dropout: float = 0.5):
        super().__init__()
        self.Conv2d_1a_3x3 = BasicConv2d(3, 32, kernel_size=3, stride=2)
        self.Conv2d_2a_3x3 = BasicConv2d(32, 32, kernel_size=3)
        self.Conv2d_2b_3x3 = BasicConv2d(32, 64, kernel_size=3, padding=1)
        self.maxpool1 = nn.MaxPool2d(kernel_size=3, stride=2)
        self.Conv2d_3b_1x1 = BasicConv2d(64, 80, kernel_size=1)
        self.Conv2d_4a_3x3 = BasicConv2d(80, 192, kernel_size=3)
        self.maxpool2 = nn.MaxPool2d(kernel_size=3, stride=2)
        self.Mixed_5b = InceptionA(192, pool_features=32)
        self.Mixed_5c = InceptionA(256, pool_features=64)
        self.Mixed_5d = InceptionA(288, pool_features=64)
        self.Mixed_6a = InceptionB(288)
        self.Mixed_6b = InceptionC(768, c7=128)
        self.Mixed_6c = InceptionC(768, c7=160)
        self.Mixed_6d = InceptionC(768, c7=160)
        self.Mixed_6e = InceptionC(768, c7=192)
        self.AuxLogits = InceptionAux(768, num_classes) if aux_logits else None
        self.Mixed_7a = InceptionD(768)
        self.Mixed_7b = InceptionE(1280)
        self.Mixed_7c = InceptionE(2048)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(2048, num_classes)

    def forward(self, x: torch.Tensor) -> Output:
        for name in ("Conv2d_1a_3x3", "Conv2d_2a_3x3", "Conv2d_2b_3x3", "maxpool1",
                     "Conv2d_3b_1x1", "Conv2d_4a_3x3", "maxpool2", "Mixed_5b", "Mixed_5c",
                     "Mixed_5d", "Mixed_6a", "Mixed_6b", "Mixed_6c", "Mixed_6d", "Mixed_6e"):
            x = getattr(self, name)(x)
        aux = self.AuxLogits(x) if self.AuxLogits is not None and self.training else None
        x = self.Mixed_7c(self.Mixed_7b(self.Mixed_7a(x)))
        logits = self.fc(torch.flatten(self.dropout(self.avgpool(x)), 1))
        return logits if aux is None else (logits, aux)


# ----------------------------------------------------------------------------- GoogLeNet

class Inception(nn.Module):
    """GoogLeNet's Inception module: 1x1, 1x1->3x3, 1x1->3x3 and maxpool->1x1 branches."""

    def __init__(self, c: int, ch1x1: int, ch3x3red: int, ch3x3: int, ch5x5red: int,
                 ch5x5: int, pool_proj: int):
        super().__init__()
        self.branch1 = BasicConv2d(c, ch1x1, kernel_size=1)
        self.branch2 = nn.Sequential(BasicConv2d(c, ch3x3red, kernel_size=1),
                                     BasicConv2d(ch3x3red, ch3x3, kernel_size=3, padding=1))
        self.branch3 = nn.Sequential(BasicConv2d(c, ch5x5red, kernel_size=1),
                                     BasicConv2d(ch5x5red, ch5x5, kernel_size=3, padding=1))
        self.branch4 = nn.Sequential(
            nn.MaxPool2d(kernel_size=3, stride=1, padding=1, ceil_mode=True),
            BasicConv2d(c, pool_proj, kernel_size=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.branch1(x), self.branch2(x), self.branch3(x), self.branch4(x)], 1)


class GoogLeNetAux(nn.Module):
    """GoogLeNet's auxiliary classifier (after inception4a and inception4d)."""

    def __init__(self, c: int, num_classes: int, dropout: float = 0.7):
        super().__init__()
        self.conv = BasicConv2d(c, 128, kernel_size=1)
        self.fc1 = nn.Linear(2048, 1024)
        self.relu = nn.ReLU(inplace=True)
        self.dropout = nn.Dropout(dropout)
        self.fc2 = nn.Linear(1024, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(F.adaptive_avg_pool2d(x, (4, 4)))
        return self.fc2(self.dropout(self.relu(self.fc1(torch.flatten(x, 1)))))


# GoogLeNet's inception modules (Szegedy et al. 2015, Table 1), and the max-pools between them.
_GOOGLENET = (
    ("inception3a", (192, 64, 96, 128, 16, 32, 32)),
    ("inception3b", (256, 128, 128, 192, 32, 96, 64)),
    ("maxpool3", 3),
    ("inception4a", (480, 192, 96, 208, 16, 48, 64)),
    ("inception4b", (512, 160, 112, 224, 24, 64, 64)),
    ("inception4c", (512, 128, 128, 256, 24, 64, 64)),
    ("inception4d", (512, 112, 144, 288, 32, 64, 64)),
    ("inception4e", (528, 256, 160, 320, 32, 128, 128)),
    ("maxpool4", 2),
    ("inception5a", (832, 256, 160, 320, 32, 128, 128)),
    ("inception5b", (832, 384, 192, 384, 48, 128, 128)),
)


class GoogLeNet(nn.Module):
    """GoogLeNet (torchvision's, with ``transform_input=False``)."""

    def __init__(self, num_classes: int = 1000, aux_logits: bool = False, dropout: float = 0.2):
        super().__init__()
        self.conv1 = BasicConv2d(3, 64, kernel_size=7, stride=2, padding=3)
        self.maxpool1 = nn.MaxPool2d(3, stride=2, ceil_mode=True)
        self.conv2 = BasicConv2d(64, 64, kernel_size=1)
        self.conv3 = BasicConv2d(64, 192, kernel_size=3, padding=1)
        self.maxpool2 = nn.MaxPool2d(3, stride=2, ceil_mode=True)
        for name, arg in _GOOGLENET:
            self.add_module(name, Inception(*arg) if name.startswith("inception")
                            else nn.MaxPool2d(arg, stride=2, ceil_mode=True))
        self.aux1 = GoogLeNetAux(512, num_classes) if aux_logits else None
        self.aux2 = GoogLeNetAux(528, num_classes) if aux_logits else None
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(1024, num_classes)

    def forward(self, x: torch.Tensor) -> Output:
        x = self.maxpool2(self.conv3(self.conv2(self.maxpool1(self.conv1(x)))))
        heads = {"inception4a": self.aux1, "inception4d": self.aux2} if self.training else {}
        aux: list[torch.Tensor] = []
        for name, _ in _GOOGLENET:
            x = getattr(self, name)(x)
            if heads.get(name) is not None:
                aux.append(heads[name](x))
        logits = self.fc(self.dropout(torch.flatten(self.avgpool(x), 1)))
        # torchvision's order: logits, then aux2 (after 4d), then aux1 (after 4a).
        return (logits, *reversed(aux)) if aux else logits


_LOGITS = "logits (batch, num_classes)"

SPECS = (
    ModelSpec("inception_v3", "inception", Inception3, image_inputs,
              arch={"num_classes": 1000, "aux_logits": True, "dropout": 0.5},
              data={"image_size": 299}, batch_size=32,
              input="images (batch, 3, image_size, image_size) float32; image_size 299",
              output=f"{_LOGITS}; in training with aux_logits a tuple (logits, aux_logits)",
              source="Szegedy et al., CVPR 2016; torchvision.models.inception_v3"),
    ModelSpec("googlenet", "inception", GoogLeNet, image_inputs,
              arch={"num_classes": 1000, "aux_logits": False, "dropout": 0.2},
              data={"image_size": 224}, batch_size=64,
              input="images (batch, 3, image_size, image_size) float32; image_size 224",
              output=f"{_LOGITS}; in training with aux_logits a tuple (logits, aux2, aux1)",
              source="Szegedy et al., CVPR 2015; torchvision.models.googlenet"),
)
