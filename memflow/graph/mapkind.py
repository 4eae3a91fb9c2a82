"""What kind of values a feature map holds, as far as its compression ratio goes.

An error-bounded compressor packs maps of different kinds very differently at one absolute
bound, because the bits it needs grow with the log of the map's spread over the bound: a
softmax's probabilities (in [0, 1], most far under a bound like 1e-2) pack tens of times, a
map a normalization just made (batch, layer or group norm: unit spread) or its ReLU about 5x
with SZ3 at 1e-2, while a raw signed map (a convolution's or a projection's output) has the
spread its weights give it. :data:`MAP_KINDS` is the vocabulary, declared once; capture labels
every activation storage with one (``map_kind`` in the ``tensors`` table) from the op that
last wrote it, since fake tensors have no values (:func:`kind_of` is that rule):

* ``"signed"``: anything else (the model's inputs too);
* ``"normalized"``: made by a normalization;
* ``"rectified"``: made by a rectifier (ReLU and its in-place and bounded forms) from a map
  that is not normalized;
* ``"normalized-rectified"``: a rectifier's output from a normalized map (a CNN's
  conv, batch norm, ReLU);
* ``"probability"``: made by a softmax or a sigmoid;
* ``"integer"``: not floating (a max-pool's indices, a mask): the ``compress`` policy keeps
  it as it is (:data:`UNCOMPRESSED`).

Pooling, concatenation, copies and dropout keep the kind their floating inputs share.
:mod:`memflow.compress.model` holds the bits per element each kind packs into, measured per
compressor on maps labelled by this same rule (:class:`KindLabels`, on real tensors); the
memory model charges each saved record its own kind's ratio.

>>> kind_of("relu_", ["normalized"]), kind_of("max_pool2d_with_indices", ["rectified"])
('normalized-rectified', 'rectified')
>>> kind_of("cat", ["rectified", "signed"]), kind_of("_softmax", ["signed"])
('signed', 'probability')
"""
from __future__ import annotations

from typing import Any, Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["MAP_KINDS", "SIGNED", "UNCOMPRESSED", "kind_of", "kind_code", "KindLabels",
           "saved_maps"]

MAP_KINDS = ("signed", "normalized", "rectified", "normalized-rectified", "probability",
             "integer")
SIGNED = MAP_KINDS[0]
UNCOMPRESSED = frozenset({"integer"})    # kinds no compressor packs: held at ratio 1

# aten op names (overload packets, in-place forms without their trailing underscore)
_RECTIFIERS = frozenset({"relu", "relu6", "threshold"})
_MAKES = {
    "native_batch_norm": "normalized", "_native_batch_norm_legit": "normalized",
    "_native_batch_norm_legit_functional": "normalized",
    "_native_batch_norm_legit_no_training": "normalized", "native_layer_norm": "normalized",
    "native_group_norm": "normalized", "_fused_rms_norm": "normalized",
    "_softmax": "probability", "softmax": "probability", "sigmoid": "probability",
}
# ops whose output is of the kind of their floating inputs when those all share one
_KEEPS = frozenset({
    "max_pool1d", "max_pool2d", "max_pool3d", "max_pool2d_with_indices",
    "max_pool3d_with_indices", "avg_pool1d", "avg_pool2d", "avg_pool3d",
    "_adaptive_avg_pool2d", "adaptive_avg_pool2d", "adaptive_max_pool2d", "mean", "cat",
    "stack", "clone", "_to_copy", "copy", "contiguous", "native_dropout", "dropout",
    "constant_pad_nd", "upsample_nearest2d", "index_select", "gather",
})


def kind_of(op: str, inputs: Iterable[str], floating: bool = True) -> str:
    """The kind of what op ``op`` (an aten overload packet's name) writes, given the kinds of
    its floating tensor inputs; ``floating``: whether the output is (else ``"integer"``)."""
    if not floating:
        return "integer"
    name = op[:-1] if op.endswith("_") and not op.endswith("__") else op
    if name in _RECTIFIERS:
        normalized = set(inputs) & {"normalized", "normalized-rectified"}
        return "normalized-rectified" if normalized else "rectified"
    made = _MAKES.get(name)
    if made is not None:
        return made
    if name in _KEEPS:
        kinds = set(inputs)
        if len(kinds) == 1:
            return kinds.pop()
    return SIGNED


def kind_code(kind: str) -> int:
    """The position of ``kind`` in :data:`MAP_KINDS` (what the memory model's arrays hold)."""
    try:
        return MAP_KINDS.index(kind)
    except ValueError:
        raise ValueError(f"map_kind must be one of {', '.join(MAP_KINDS)}, got {kind!r}") from None


class KindLabels(TorchDispatchMode):
    """Labels the storages a real forward writes with their kind by :func:`kind_of`, as
    capture does on fake tensors: ``labels[storage data_ptr]`` (the yardstick the ratios of
    :mod:`memflow.compress.model` are measured with)."""

    def __init__(self) -> None:
        super().__init__()
        self.labels: dict[int, str] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        kinds = [self.labels.get(t.untyped_storage().data_ptr(), SIGNED)
                 for t in tree_leaves((args, kwargs))
                 if isinstance(t, torch.Tensor) and t.is_floating_point()]
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs))
                  if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                ptr = t.untyped_storage().data_ptr()
                if ptr not in inputs or func._schema.is_mutable:   # a view keeps its kind
                    self.labels[ptr] = kind_of(func.overloadpacket.__name__, kinds,
                                               t.is_floating_point())
        return out


def saved_maps(model: torch.nn.Module, *inputs: Any, min_numel: int = 64,
               kwargs: dict | None = None) -> list[tuple[torch.Tensor, str]]:
    """``(map, kind)`` of every floating storage autograd saves in one real forward of
    ``model`` (parameters excluded, each storage once, at least ``min_numel`` elements);
    ``kwargs``: the forward's keyword inputs."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, torch.Tensor] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if t.is_floating_point() and t.layout == torch.strided and ptr not in params \
                and t.numel() >= min_numel:
            seen.setdefault(ptr, t.detach())
        return t

    with KindLabels() as mode, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(*inputs, **(kwargs or {}))
    return [(t, mode.labels.get(ptr, SIGNED)) for ptr, t in seen.items()]
