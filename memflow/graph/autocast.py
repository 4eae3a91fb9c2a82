"""Mixed precision during capture: ``torch.autocast`` semantics for the backend's device.

Capture runs on fake CPU tensors. For ``backend="cpu"`` that is exactly ``torch.autocast("cpu")``.
CUDA's autocast cannot run here (its dispatch key needs a CUDA build), and its op lists differ
from the CPU's: on CUDA, softmax, LayerNorm, ``exp``, ``sum``… run in float32 while the CPU keeps
the input's half dtype. :class:`CudaAutocast` applies CUDA's policy (PyTorch's
``autocast_mode.cpp``) to the torch functions a model calls:

* :data:`LOWER` (matrix products, convolutions, attention): floating inputs cast to the
  autocast dtype — weights included, and a weight is cast once per capture, as autocast's
  cache does;
* :data:`FP32`: floating inputs cast to float32;
* :data:`FP32_DTYPE` (softmax, sums): run with ``dtype=torch.float32`` when no dtype is given;
* :data:`PROMOTE` (``cat``, ``stack``…): floating inputs cast to the widest input dtype.

The policy applies to the functions a model calls itself (through ``nn`` modules or
``torch.nn.functional``); functions that PyTorch calls from inside another Python function of
``torch.nn.functional`` (such as ``multi_head_attention_forward``) keep the CPU's behaviour.

>>> import torch
>>> cast = CudaAutocast(torch.float16)
>>> x = torch.ones(2, 3)
>>> args, kwargs = cast.cast("softmax", (x.half(), -1), {})
>>> kwargs["dtype"]
torch.float32
>>> cast.cast("linear", (x, torch.ones(4, 3)), {})[0][1].dtype
torch.float16
"""
from __future__ import annotations

import contextlib
from typing import Any, ContextManager

import torch

__all__ = ["LOWER", "FP32", "FP32_DTYPE", "PROMOTE", "DTYPES", "AMP_DTYPE", "CudaAutocast",
           "parse_autocast", "cpu_autocast"]

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
"""Autocast dtypes capture accepts, by name."""
AMP_DTYPE = torch.float16
"""The dtype the ``amp`` precision autocasts to: capture's amp pass and the exported script
(:mod:`memflow.export.amp`) share it."""

LOWER = frozenset({
    "linear", "matmul", "mm", "bmm", "addmm", "addbmm", "baddbmm", "addmv", "addr", "mv",
    "einsum", "chain_matmul", "multi_dot", "linalg_vecdot", "conv1d", "conv2d", "conv3d",
    "conv_tbc", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "convolution",
    "_convolution", "prelu", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
    "scaled_dot_product_attention", "__matmul__", "__rmatmul__",
})
FP32 = frozenset({
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
    "reciprocal", "rsqrt", "sinh", "tan", "pow", "__pow__", "__rpow__", "softplus",
    "layer_norm", "group_norm", "norm", "frobenius_norm", "nuclear_norm", "cosine_similarity",
    "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
    "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
    "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
    "multi_margin_loss", "binary_cross_entropy_with_logits", "cross_entropy", "dist", "pdist",
    "cdist", "renorm", "logsumexp", "interpolate", "upsample_nearest1d", "upsample_nearest2d",
    "upsample_nearest3d", "upsample_linear1d", "upsample_bilinear2d", "upsample_trilinear3d",
})
FP32_DTYPE = frozenset({"softmax", "log_softmax", "cumsum", "cumprod", "prod", "sum",
                        "linalg_vector_norm", "linalg_matrix_norm"})
PROMOTE = frozenset({"cat", "stack", "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot",
                     "tensordot", "index_put", "scatter_add", "grid_sampler"})

_HALF = (torch.float16, torch.bfloat16)


def parse_autocast(autocast: Any) -> torch.dtype | None:
    """The dtype named by ``autocast`` (None, ``"float16"``, ``"bfloat16"`` or a torch dtype).

    >>> parse_autocast("bfloat16")
    torch.bfloat16
    >>> parse_autocast("int8")
    Traceback (most recent call last):
    ...
    memflow.errors.CaptureError: autocast='int8' is not supported; valid: None, 'float16', 'bfloat16'
    """
    from ..errors import CaptureError

    if autocast is None:
        return None
    if isinstance(autocast, torch.dtype) and autocast in DTYPES.values():
        return autocast
    if isinstance(autocast, str) and autocast in DTYPES:
        return DTYPES[autocast]
    raise CaptureError(f"autocast={autocast!r} is not supported; valid: None, 'float16', "
                       "'bfloat16'")


def cpu_autocast(dtype: torch.dtype | None) -> ContextManager:
    """``torch.autocast("cpu", dtype)``, or nothing when ``dtype`` is None."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast("cpu", dtype=dtype)


class CudaAutocast:
    """CUDA's autocast policy applied to the arguments of torch functions."""

    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype
        self._weights: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def _to(self, t: Any, dtype: torch.dtype) -> Any:
        if not (isinstance(t, torch.Tensor) and t.is_floating_point()) or t.dtype in (
                dtype, torch.float64):
            return t
        if t.is_leaf and t.requires_grad:      # a weight: cast once, like autocast's cache
            key = id(t)
            hit = self._weights.get(key)
            if hit is None or hit[0] is not t or hit[1].dtype != dtype:
                hit = (t, t.to(dtype))
                self._weights[key] = hit
            return hit[1]
        return t.to(dtype)

    def _map(self, obj: Any, dtype: torch.dtype) -> Any:
        if isinstance(obj, (list, tuple)):
            return type(obj)(self._map(o, dtype) for o in obj)
        return self._to(obj, dtype)

    def cast(self, name: str, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        """``(args, kwargs)`` cast for function ``name``, or None if the policy leaves it."""
        if name in LOWER:
            dtype = self.dtype
        elif name in FP32:
            dtype = torch.float32
        elif name in FP32_DTYPE:
            first = args[0] if args else None
            if kwargs.get("dtype") is None and isinstance(first, torch.Tensor) and \
                    first.dtype in _HALF:
                return args, {**kwargs, "dtype": torch.float32}
            return None
        elif name in PROMOTE:
            found = [t.dtype for t in _flat(args) if isinstance(t, torch.Tensor)
                     and t.is_floating_point()]
            if len(set(found)) < 2:
                return None
            dtype = max(found, key=lambda d: torch.finfo(d).bits)
        else:
            return None
        return (self._map(args, dtype),
                {k: self._map(v, dtype) for k, v in kwargs.items()})


def _flat(args: Any):
    for a in args:
        if isinstance(a, (list, tuple)):
            yield from _flat(a)
        else:
            yield a
