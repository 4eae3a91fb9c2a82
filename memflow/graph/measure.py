"""What real autograd saves: the yardstick capture is checked against.

:func:`saved_bytes` runs a model on real tensors (on the device they are on — CPU here) with
``torch.autograd.graph.saved_tensors_hooks`` and adds up the storages autograd keeps for
backward: each storage once (views share it), parameters and buffers excluded (a view of a
parameter is the parameter). :func:`saved_bytes_by_module` splits the same total by the
innermost module running when each storage was first saved, ``"<root>"`` for the model's own
code and ``"<loss>"`` for ``loss_fn``. Tests, benchmarks and ``memflow.export``'s validation
use them.

>>> import torch
>>> from torch import nn
>>> model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
>>> saved_bytes(model, torch.randn(8, 16))          # the input and the ReLU output
1536
>>> saved_bytes_by_module(model, torch.randn(8, 16)).to_dict()
{'0': 512, '1': 1024}
"""
from __future__ import annotations

from typing import Any, Callable

import pandas as pd
import torch
from torch import nn
from torch.utils import _pytree as pytree

from ..errors import CaptureError
from .autocast import cpu_autocast, parse_autocast
from .capture import split_inputs
from .units import LOSS, module_paths

__all__ = ["saved_bytes", "saved_bytes_by_module"]


def _check_real(model: nn.Module, args: tuple, kwargs: dict) -> None:
    for where, t in [("parameter", p) for p in model.parameters()] + \
            [("input", t) for t in pytree.tree_leaves((args, kwargs))]:
        if isinstance(t, torch.Tensor) and t.is_meta:
            raise CaptureError(f"measuring runs the model for real, but a {where} is on the "
                               "meta device; build the model and inputs on 'cpu' (e.g. "
                               "memflow.zoo.get(name, device='cpu'))")


def saved_bytes_by_module(model: nn.Module, example_inputs: Any,
                          loss_fn: Callable[[Any], torch.Tensor] | None = None, *,
                          autocast: Any = None) -> pd.Series:
    """Bytes autograd saves in one real forward (and ``loss_fn``), by innermost module path.

    Each storage counts once, for the module running when it was first saved; modules that
    save nothing are absent. ``autocast`` (``"float16"``/``"bfloat16"``) runs under
    ``torch.autocast("cpu")``.
    """
    args, kwargs = split_inputs(example_inputs)
    _check_real(model, args, kwargs)
    dtype = parse_autocast(autocast)
    paths = module_paths(model)
    stack: list[str] = []
    weights = {t.untyped_storage()._cdata
               for t in list(model.parameters()) + list(model.buffers())}
    found: dict[int, tuple[str, int, torch.UntypedStorage]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        key = storage._cdata
        if key not in weights and key not in found:
            # Holding the storage keeps its address from being reused by another one.
            found[key] = (stack[-1] if stack else LOSS, storage.nbytes(), storage)
        return t

    def enter(module: nn.Module, args: Any) -> None:
        stack.append(paths[module])

    def leave(module: nn.Module, args: Any, output: Any) -> None:
        stack.pop()               # a forward hook that returned a value would replace the output

    handles = []
    for m in model.modules():
        handles.append(m.register_forward_pre_hook(enter))
        handles.append(m.register_forward_hook(leave))
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), cpu_autocast(dtype):
            out = model(*args, **kwargs)
            if loss_fn is not None:
                loss_fn(out)
    finally:
        for h in handles:
            h.remove()
    totals: dict[str, int] = {}
    for path, nbytes, _ in found.values():
        totals[path] = totals.get(path, 0) + nbytes
    return pd.Series(totals, dtype="int64", name="saved_bytes")


def saved_bytes(model: nn.Module, example_inputs: Any,
                loss_fn: Callable[[Any], torch.Tensor] | None = None, *,
                autocast: Any = None) -> int:
    """Total bytes autograd saves for backward in one real forward (and ``loss_fn``)."""
    return int(saved_bytes_by_module(model, example_inputs, loss_fn, autocast=autocast).sum())
