"""Which modules a parameter split can slice, and along which weight axis — declared once.

FlexFlow's parameter dimension of a ``Linear`` or a convolution is its output features (rows
of the weight); of an ``Embedding``, its embedding dimension (columns of the table). A module
of another kind, or a grouped convolution (whose output channels each read one group of the
input channels), has no such slice. Capture writes :func:`shard_axis` of each unit's module in
the ``shard_axis`` unit column, so the search knows what export can split
(:mod:`memflow.strategy.runnable`), and export slices by the same rule
(:mod:`memflow.export.sharding`).

>>> from torch import nn
>>> shard_axis(nn.Linear(4, 2)), shard_axis(nn.Embedding(10, 4)), shard_axis(nn.ReLU())
(0, 1, -1)
>>> shard_axis(nn.Conv2d(4, 4, 3)), shard_axis(nn.Conv2d(4, 4, 3, groups=2))
(0, -1)
"""
from __future__ import annotations

from torch import nn

__all__ = ["SLICEABLE", "CONVOLUTIONS", "shard_axis"]

CONVOLUTIONS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
SLICEABLE: dict[type, int] = {nn.Linear: 0, nn.Embedding: 1,
                              **{c: 0 for c in CONVOLUTIONS}}
"""Module type → the weight axis of its output features (what a parameter split slices)."""


def shard_axis(module: nn.Module | None) -> int:
    """The weight axis a parameter split of ``module`` slices; -1 when it cannot be sliced."""
    axis = next((a for kind, a in SLICEABLE.items() if isinstance(module, kind)), -1)
    if isinstance(module, CONVOLUTIONS) and module.groups != 1:
        return -1
    return axis
