"""Which modules a parameter split can slice, and along which weight axis — declared once.

FlexFlow's parameter dimension of a ``Linear`` or a convolution is its output features (rows
of the weight); of an ``Embedding``, its embedding dimension (columns of the table). A module
of another kind, or a grouped convolution (whose output channels each read one group of the
input channels), has no such slice. Capture writes :func:`shard_axis` of each unit's module in
the ``shard_axis`` unit column, so the search knows what export can split
(:mod:`memflow.strategy.runnable`), and export slices by the same rule
(:mod:`memflow.export.sharding`).

A module with children (a transformer block) has no such slice, but Megatron's tensor
parallelism splits it when every ``Linear`` inside is a child named in a declared ``tp_plan``
(its children's styles, as Hugging Face's ``base_model_tp_plan``: column-parallel
``colwise-sharded`` or ``colwise-qkv``, then ``rowwise``) and nothing else inside holds a weight
but normalizations: :func:`tensor_degree` is the largest degree dividing every declared
module's head counts and sharded widths, which capture writes in the ``tensor_degree`` unit
column (0: no such container).

>>> from torch import nn
>>> shard_axis(nn.Linear(4, 2)), shard_axis(nn.Embedding(10, 4)), shard_axis(nn.ReLU())
(0, 1, -1)
>>> shard_axis(nn.Conv2d(4, 4, 3)), shard_axis(nn.Conv2d(4, 4, 3, groups=2))
(0, -1)
"""
from __future__ import annotations

from torch import nn

__all__ = ["SLICEABLE", "CONVOLUTIONS", "MEGATRON_STYLES", "shard_axis", "declared_degree",
           "tensor_degree"]

CONVOLUTIONS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
SLICEABLE: dict[type, int] = {nn.Linear: 0, nn.Embedding: 1,
                              **{c: 0 for c in CONVOLUTIONS}}
"""Module type → the weight axis of its output features (what a parameter split slices)."""

MEGATRON_STYLES = ("colwise-sharded", "colwise-qkv", "rowwise")
"""The ``tp_plan`` styles of a Megatron module: column-parallel with the output left sharded
(a fused q, k, v projection regrouped by heads), then row-parallel (the output summed)."""
_HEADS = ("n_head", "n_kv_head")
_NORMS = (nn.LayerNorm, nn.RMSNorm, nn.GroupNorm)


def shard_axis(module: nn.Module | None) -> int:
    """The weight axis a parameter split of ``module`` slices; -1 when it cannot be sliced."""
    axis = next((a for kind, a in SLICEABLE.items() if isinstance(module, kind)), -1)
    if isinstance(module, CONVOLUTIONS) and module.groups != 1:
        return -1
    return axis


def declared_degree(module: nn.Module) -> int:
    """The greatest common divisor of ``module``'s head counts (``n_head``, ``n_kv_head``) and
    the widths its declared ``tp_plan`` shards (output features of a column-parallel child,
    input features of a row-parallel one): the ranks its plan splits evenly divide it. 0 when
    it declares no Megatron plan of ``Linear`` children.

    >>> class MLP(nn.Sequential):
    ...     tp_plan = {"0": "colwise-sharded", "2": "rowwise"}
    >>> declared_degree(MLP(nn.Linear(4, 12), nn.ReLU(), nn.Linear(12, 4)))
    12
    """
    import math
    plan = getattr(module, "tp_plan", None)
    kids = dict(module.named_children())
    if not isinstance(plan, dict) or not plan or not all(
            style in MEGATRON_STYLES and isinstance(kids.get(c), nn.Linear)
            for c, style in plan.items()):
        return 0
    widths = [kids[c].in_features if style == "rowwise" else kids[c].out_features
              for c, style in plan.items()]
    heads = [int(getattr(module, k)) for k in _HEADS if isinstance(getattr(module, k, None), int)]
    return math.gcd(*widths, *heads)


def tensor_degree(module: nn.Module | None) -> int:
    """The largest degree Megatron's tensor parallelism splits ``module`` at (module
    docstring): a container whose every ``Linear`` is declared by a Megatron ``tp_plan`` and
    whose other weights are normalizations'; 0 for anything else.

    >>> class MLP(nn.Sequential):
    ...     tp_plan = {"0": "colwise-sharded", "2": "rowwise"}
    >>> block = nn.Sequential(nn.LayerNorm(4), MLP(nn.Linear(4, 6), nn.GELU(), nn.Linear(6, 4)))
    >>> tensor_degree(block), tensor_degree(nn.Sequential(nn.Linear(4, 4))), tensor_degree(None)
    (6, 0, 0)
    """
    import math
    if module is None or not any(True for _ in module.children()):
        return 0
    degree, declared = 0, set()
    for m in module.modules():
        d = declared_degree(m)
        if d:
            degree = math.gcd(degree, d)
            declared.update(id(getattr(m, c)) for c in m.tp_plan)
    for m in module.modules():
        weighted = any(True for _ in m.parameters(recurse=False))
        if isinstance(m, nn.Linear) and id(m) not in declared or weighted and not isinstance(
                m, (nn.Linear, *_NORMS)):
            return 0
    return degree
