"""The ``amp`` precision in the exported script: autocast mixed precision with a loss scaler.

``amp`` keeps the model as it is — fp32 weights, gradients and optimizer states — and runs the
forward and the loss under ``torch.autocast(device_type, dtype=torch.float16)``
(:func:`autocast`): autocast casts the inputs of its lower-precision ops (matrix products,
convolutions) to float16, caching one half copy of each weight for the step, and runs its fp32
list (norms, losses, ``exp``…) in float32. On the CPU (the gloo tests) this is
``torch.autocast("cpu", dtype=torch.float16)``, which PyTorch 2.13 runs (with the CPU's own op
lists, as capture's ``backend="cpu"`` records them). Capture's amp pass (``OpGraph.amp``,
:func:`memflow.from_torch`) runs the same program, so the memory model charges what this one
holds.

float16 gradients underflow without scaling: backward runs on the loss times a scale, and the
optimizer steps the unscaled gradients unless one of them is not finite (then the step is
skipped and the scale shrinks) — ``torch.amp.GradScaler`` (:func:`grad_scaler`). Its unscale
runs one ``foreach`` call per kind of gradient: FSDP2's DTensor gradients (whose "found inf"
DTensor reduces over their mesh) apart from plain ones (equal on every replica once averaged by
DistributedDataParallel or by hand), as one call cannot take both (:class:`AmpScaler`).

>>> from torch import nn
>>> from memflow.export.model_states import Steps
>>> m = nn.Linear(4, 2)
>>> opt = Steps.build(list(m.parameters()), torch.optim.SGD, {"lr": 0.1})
>>> scaler = grad_scaler("amp", torch.device("cpu"))
>>> with autocast("amp", torch.device("cpu")):
...     y = m(torch.ones(3, 4))
>>> scaler.scale(y.float().sum()).backward(); scaler.step(opt); scaler.update()
>>> y.dtype, m.weight.dtype, m.weight.grad.dtype
(torch.float16, torch.float32, torch.float32)
"""
from __future__ import annotations

import contextlib
from typing import ContextManager

import torch

from ..graph.autocast import AMP_DTYPE

__all__ = ["autocast", "grad_scaler", "AmpScaler"]


def autocast(precision: str | None, device: torch.device) -> ContextManager:
    """The context the forward and loss run in: float16 autocast on ``device``'s type under
    ``amp``, nothing otherwise."""
    if precision != "amp":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=AMP_DTYPE)


class AmpScaler(torch.amp.GradScaler):
    """``torch.amp.GradScaler`` unscaling DTensor and plain gradients in separate calls."""

    def _unscale_grads_(self, optimizer, inv_scale: torch.Tensor, found_inf: torch.Tensor,
                        allow_fp16: bool) -> dict[torch.device, torch.Tensor]:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        found: dict[torch.device, torch.Tensor] = {}
        for dtensor in (False, True):
            kind = [p for p in params if hasattr(p, "device_mesh") == dtensor]
            if not kind:
                continue
            part = super()._unscale_grads_(_Group(kind), inv_scale, found_inf, allow_fp16)
            for device, flag in part.items():     # one tensor per device: the same, or summed
                found[device] = flag if device not in found or found[device] is flag \
                    else found[device] + flag
        return found


class _Group:
    """What ``GradScaler._unscale_grads_`` reads of an optimizer: its parameter groups."""

    def __init__(self, params: list):
        self.param_groups = [{"params": params}]


def grad_scaler(precision: str | None, device: torch.device) -> AmpScaler:
    """The loss scaler of the step: enabled under ``amp`` (float16 gradients need it), a pass-
    through otherwise (``scale`` returns the loss, ``step`` steps the optimizer)."""
    return AmpScaler(device.type, enabled=precision == "amp")
