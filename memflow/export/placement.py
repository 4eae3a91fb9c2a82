"""Placement: which torch device runs each unit of one replica, and moving the model there.

A strategy names devices (``gpu0``, ``gpu1``...) and splits each unit into parts: ``sample``
(data parallel), ``attribute`` (spatial / sequence) and ``parameter`` (output channels). Parts
are numbered sample-major, then attribute, then parameter (:mod:`memflow.strategy`). Export
runs data parallelism as whole-model replicas (``DistributedDataParallel`` in the training
script), so replica ``r`` is the ``r``-th sample part of every unit. What export can run —
one sample degree for every unit, no attribute split, parameter splits of sliceable modules
(:mod:`memflow.export.sharding`) — is declared once in :mod:`memflow.strategy.runnable`.

Everything refused raises :class:`~memflow.errors.ExportError` naming the unit.

Device names map to torch devices with :func:`torch_devices`: ``gpuK`` is ``cuda:K`` modulo
the GPUs present (one node), or ``cpu`` on a machine without CUDA, so any strategy runs on a
laptop for testing. Parameters and buffers move to the device of the unit that owns them — the
first unit, in execution order, whose module holds them (capture's rule, so tied weights go
with their first user).

>>> from memflow.strategy import Strategy
>>> s = Strategy(["a", "b"], devices=[("gpu0", "gpu1")] * 2, sample=[2, 2])
>>> replica_devices(s, 1, {"gpu0": torch.device("cpu"), "gpu1": torch.device("meta")})
[(device(type='meta'),), (device(type='meta'),)]
"""
from __future__ import annotations

from typing import Mapping, Sequence

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

from ..errors import ExportError
from ..strategy.runnable import unrunnable
from .spans import Span, within

__all__ = ["torch_devices", "replicas", "replica_devices", "owned_tensors", "place",
           "MoveTo"]


def torch_devices(names: Sequence[str],
                  mapping: Mapping[str, str | torch.device] | None = None) -> dict[str, torch.device]:
    """The torch device of each device name (``mapping`` overrides the default rule).

    >>> torch_devices(["gpu0", "gpu1"], {"gpu1": "meta"})["gpu1"]
    device(type='meta')
    """
    mapping = dict(mapping or {})
    gpus = torch.cuda.device_count()
    out = {}
    for name in names:
        if name in mapping:
            out[name] = torch.device(mapping[name])
        elif gpus:
            digits = "".join(ch for ch in name if ch.isdigit())
            out[name] = torch.device("cuda", int(digits or 0) % gpus)
        else:
            out[name] = torch.device("cpu")
    return out


def replicas(strategy) -> int:
    """The data-parallel degree: the largest unit's sample degree (every unit's, unless the
    strategy has per-unit degrees: :mod:`memflow.export.sample_groups`). A strategy export
    cannot run raises :class:`~memflow.errors.ExportError` with the reason
    :func:`~memflow.strategy.runnable.unrunnable` gives.

    >>> from memflow.strategy import Strategy
    >>> s = Strategy(["a", "b"], devices=[("gpu0", "gpu1"), ("gpu0",)], sample=[2, 1])
    >>> replicas(s)
    2
    >>> replicas(s.with_schedule(microbatches=2))
    Traceback (most recent call last):
    ...
    memflow.errors.ExportError: unit 'b' has sample degree 1 but unit 'a' has 2, and the strategy has 2 micro-batches; ...
    """
    reason = unrunnable(strategy)
    if reason is not None:
        raise ExportError(reason)
    return int(strategy.sample.max())


def replica_devices(strategy, replica: int,
                    devices: Mapping[str, torch.device]) -> list[tuple[torch.device, ...]]:
    """Per unit, the torch devices of replica ``replica``'s parts (one per parameter shard);
    a unit of a smaller sample degree than :func:`replicas` runs the replica on the part
    holding its share of the batch."""
    n = replicas(strategy)
    if not 0 <= replica < n:
        raise ExportError(f"replica {replica} does not exist; the strategy has {n} "
                          f"data-parallel replicas (0..{n - 1})")
    out = []
    for i in range(len(strategy.units)):
        p = int(strategy.parameter[i])
        part = replica * int(strategy.sample[i]) // n
        parts = strategy.devices[i][part * p:(part + 1) * p]
        out.append(tuple(devices[d] for d in parts))
    return out


def owned_tensors(model: nn.Module, spans: Sequence[Span],
                  modules: Mapping[str, nn.Module]) -> dict[int, list[torch.Tensor]]:
    """Per unit index, the parameters and buffers it owns (each tensor in one unit only).

    A module unit owns what its module holds; a glue unit what its module holds directly.
    The first unit in execution order wins, as in capture.
    """
    seen: set[int] = set()
    owned: dict[int, list[torch.Tensor]] = {}
    for s in spans:
        if s.module not in modules:
            continue
        m = modules[s.module]
        recurse = s.role == "module"
        for t in [*m.parameters(recurse=recurse), *m.buffers(recurse=recurse)]:
            if id(t) not in seen:
                seen.add(id(t))
                owned.setdefault(s.index, []).append(t)
    return owned


def place(model: nn.Module, spans: Sequence[Span], modules: Mapping[str, nn.Module],
          devices: Sequence[Sequence[torch.device]]) -> None:
    """Move each unit's parameters and buffers to its (first) device, in place.

    What no unit owns (a module never called) goes with the unit of its nearest ancestor.
    """
    target: dict[int, tuple[torch.Tensor, torch.device]] = {}
    for i, tensors in owned_tensors(model, spans, modules).items():
        for t in tensors:
            target[id(t)] = (t, devices[i][0])
    for path, m in modules.items():
        home = next((s.index for s in reversed(spans) if within(path, s.module)), None)
        for t in [*m.parameters(recurse=False), *m.buffers(recurse=False)]:
            if id(t) not in target and home is not None:
                target[id(t)] = (t, devices[home][0])
    replaced: dict[int, torch.Tensor] = {}
    for t, device in target.values():
        if t.device == device:
            continue
        moved = t.data.to(device)
        if torch._has_compatible_shallow_copy_type(t, moved):
            # Replace the data, not the object: optimizers and tied modules keep it.
            t.data = moved
        else:       # another tensor type (the meta device): swap the object, as Module.to does
            replaced[id(t)] = (nn.Parameter(moved, t.requires_grad)
                               if isinstance(t, nn.Parameter) else moved)
    for m in model.modules():
        for table in (m._parameters, m._buffers):
            for name, t in table.items():
                if t is not None and id(t) in replaced:
                    table[name] = replaced[id(t)]


class MoveTo(TorchFunctionMode):
    """Runs every torch call on ``device``: tensor arguments elsewhere are copied there
    (differentiably) first — the transfers between units placed on different devices. A tensor
    copied once is reused while it lives, so a unit reads each remote tensor once."""

    def __init__(self, device: torch.device):
        super().__init__()
        self.device = device
        self._copies: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def _to(self, t: torch.Tensor) -> torch.Tensor:
        if t.device == self.device:
            return t
        hit = self._copies.get(id(t))
        if hit is None or hit[0] is not t:
            hit = self._copies[id(t)] = (t, t.to(self.device, non_blocking=True))
        return hit[1]

    def __torch_function__(self, func, types, args=(), kwargs=None):
        args, kwargs = pytree.tree_map_only(torch.Tensor, self._to, (args, kwargs or {}))
        return func(*args, **kwargs)

    def __exit__(self, *exc):
        self._copies.clear()
        return super().__exit__(*exc)

