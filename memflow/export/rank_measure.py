"""What one rank of an exported training script measures, inside the rank, for per-rank
validation (:mod:`memflow.export.rank_validation`): ``--measure FOLDER`` makes every rank
write ``rank<r>.json`` after its last training step (:func:`measure_rank`).

* ``held`` — bytes its autograd graph holds for backward at the end of a forward
  (:func:`memflow.export.measure.held_bytes` inside the rank: every storage an op allocates,
  alive once outputs and inputs are dropped; parameters, buffers and FSDP2's gathered weights
  excluded). A pipeline stage holds the graphs of the micro-batches in flight at once
  (:func:`in_flight`);
* ``weights``, ``gradients``, ``optimizer`` — the bytes of the rank's local parameters and
  buffers, gradients, and optimizer states with fp32 master copies (:func:`state_bytes`: a
  DTensor or FSDP2 shard counts its local tensor); ``host`` — the optimizer states and copies
  stepped on the host (optimizer offload).
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Callable, ContextManager

import torch
from torch import nn
from torch.utils import _pytree as pytree

from .._jsonio import write_json
from ..errors import ExportError
from .measure import HOST, held_bytes

__all__ = ["measure_rank", "state_bytes", "in_flight", "STEPS"]


def _local(t: torch.Tensor) -> torch.Tensor:
    return getattr(t, "_local_tensor", t)


def state_bytes(module: nn.Module, optimizer) -> dict[str, int]:
    """Local bytes of ``module``'s parameters, buffers and plain tensor attributes, gradients,
    and ``optimizer``'s states (``step`` counters excluded) with the master copies it steps in
    the parameters' place (:class:`~memflow.export.model_states.Steps`): on the device
    (``optimizer``) or on the host (``host``: offloaded, told by the optimizer, since on a
    CPU-only machine both are one memory). A DTensor counts its local shard.

    >>> m = nn.Linear(4, 2)
    >>> opt = torch.optim.Adam(m.parameters())
    >>> m(torch.ones(1, 4)).sum().backward(); opt.step()
    >>> state_bytes(m, opt)
    {'weights': 40, 'gradients': 40, 'optimizer': 80, 'host': 0}
    """
    params = list(module.parameters())
    host = getattr(optimizer, "host", set())
    held = {"optimizer": 0, "host": 0}
    for o in getattr(optimizer, "parts", [optimizer]):   # export.model_states.Steps' parts
        for param, state in getattr(o, "optim", o).state.items():     # ZeRO-1's local part
            held["host" if id(param) in host else "optimizer"] += sum(
                _local(t).nbytes for k, t in state.items() if k != "step" and torch.is_tensor(t))
    masters = getattr(optimizer, "master_bytes", lambda: {"device": 0, "host": 0})()
    return {"weights": sum(_local(t).nbytes for t in _at_rest(module, params)),
            "gradients": sum(_local(p.grad).nbytes for p in params if p.grad is not None),
            "optimizer": held["optimizer"] + masters["device"],
            "host": held["host"] + masters["host"]}


def _at_rest(module: nn.Module, params: list) -> list[torch.Tensor]:
    """The tensors ``module`` holds between steps, each storage once: its parameters and
    buffers, and tensors kept as plain attributes — pipelining's tracer leaves a model's
    buffer (gpt2's causal mask) on a stage's ``InterpreterModule`` that way, not registered,
    though the rank holds its bytes all the same."""
    plain = [v for m in module.modules() for v in vars(m).values()
             if isinstance(v, torch.Tensor)]
    seen, out = set(), []
    for t in [*params, *module.buffers(), *plain]:
        local = _local(t)
        key = (local.untyped_storage()._cdata, local.storage_offset(), local.nbytes)
        if key not in seen:
            seen.add(key)
            out.append(local)
    return out


def _gathered(module: nn.Module) -> set[int]:
    """Storage keys of the tied weights tensor parallelism gathers in ``module``: model
    states, not activations, though a matmul saves them. (FSDP2's gathered parameters are told
    apart as its ops make them: :func:`~.measure.held_bytes`.)"""
    return {key for m in module.modules() for key in getattr(m, "_tp_gathered", ())}


def measure_rank(folder: str | Path, rank: int, path: str | None, module: nn.Module,
                 optimizer, call: tuple[tuple, dict], *, stage=None,
                 microbatches: int = 1, schedule: str = "gpipe",
                 autocast: Callable[[], ContextManager] = contextlib.nullcontext) -> dict[str, Any]:
    """What rank ``rank`` writes to ``folder/rank<r>.json`` after its last training step
    (module doc): ``module`` is what it trains (DistributedDataParallel, FSDP2 or DTensor
    wrapped, or its pipeline ``stage``'s module), ``call`` one step's ``(args, kwargs)`` of the
    rank's batch; ``autocast()`` the context its forwards run in (the ``amp`` precision's).
    Every rank of the group calls it (a forward runs its collectives).
    """
    record: dict[str, Any] = {"rank": rank, "path": path or "replicas", **state_bytes(
        getattr(module, "module", module) if stage is None else module, optimizer)}
    if stage is None:
        def finish(probes):     # a backward, so that DDP or FSDP2 close their step
            sum(probes).backward()
            optimizer.zero_grad(set_to_none=True)
        held = held_bytes(module, _inputs(*call), skip=lambda: _gathered(module), then=finish,
                          autocast=autocast)
    else:
        index, n = stage.stage_index, stage.num_stages
        if stage.is_first:
            args, kwargs = pytree.tree_map_only(
                torch.Tensor, lambda t: t[:t.shape[0] // microbatches], call)
            inputs = _inputs(args, kwargs)
        else:   # what the stage receives: the activations of the metadata its trace gave
            metas = stage._stage_meta.inputs
            args = tuple(torch.zeros_like(m.to_tensor("cpu").detach()).requires_grad_(
                m.dtype.is_floating_point) for m in metas)
            inputs = args
        held = held_bytes(module, inputs, forwards=in_flight(index, n, microbatches, schedule),
                          skip=lambda: _gathered(module), autocast=autocast)
    record["held"] = sum(v for k, v in held.items() if k != HOST)
    record["offloaded"] = held.get(HOST, 0)
    write_json(Path(folder) / f"rank{rank}.json", record)
    return record


def _inputs(args: tuple, kwargs: dict):
    """``(args, kwargs)`` as :func:`~memflow.export.measure.held_bytes` takes inputs."""
    if args and kwargs:
        raise ExportError("the model takes positional and keyword inputs at once; per-rank "
                          "validation measures models called with one kind")
    return args if args or not kwargs else kwargs


STEPS = 2
"""Training steps of a validation run: DistributedDataParallel rebuilds its gradient buckets
in the second step's forward (a one-off allocation the size of the gradients), so the
measuring forward comes after it."""


def in_flight(stage: int, stages: int, microbatches: int, schedule: str) -> int:
    """Micro-batches whose graphs stage ``stage`` holds at once: all under GPipe,
    ``min(m, stages - stage)`` under 1F1B.

    >>> [in_flight(s, 3, 4, "1f1b") for s in range(3)], in_flight(0, 3, 4, "gpipe")
    ([3, 2, 1], 4)
    """
    return microbatches if schedule == "gpipe" else min(microbatches, stages - stage)
