"""``memflow.export.apply``: a model that trains with a strategy's memory policies and placement.

:func:`apply` returns an :class:`Exported` module wrapping the model (``exported.module``).
While it runs, a :class:`~memflow.export.tracker.UnitTracker` follows the forward unit by unit
and sets each unit's policy up for exactly its span:

* ``keep``: nothing — autograd keeps what it saves;
* ``recompute``: consecutive recomputed units (``strategy.segment``) run as one non-reentrant
  checkpoint (:class:`~memflow.export.segment.Segment`); ``selective``: consecutive selective
  units likewise, the checkpoint with PyTorch's selective policy, saving expensive ops' outputs
  (:mod:`memflow.export.selective`);
* ``offload``: what the unit saves goes to host memory; ``compress``: it is packed by
  memflow's error-bounded quantizer, each element within the bound
  (:class:`~memflow.export.saved.SavedStore`);
* placement: the unit's parameters live on its device; when a replica spans several devices
  its inputs are copied to it (:class:`~memflow.export.placement.MoveTo`), and parameter
  splits are sharded (:mod:`memflow.export.sharding`);
* ``microbatches > 1`` (GPipe): the batch runs in that many slices, one after the other, and
  the outputs are concatenated; backward then runs through all of them, as GPipe holds every
  micro-batch's activations. Under 1F1B with one stage (gradient accumulation) each call
  runs one micro-batch: the training loop slices the batch and runs each micro-batch's
  forward and backward in turn (:mod:`memflow.export.accumulation`).

By default the model is deep-copied first and left as it was; ``inplace=True`` wraps the
model itself (hooks added to its modules, parameters moved, split modules replaced), for models
too large to copy; :meth:`Exported.remove` takes the hooks off again.

>>> import torch
>>> from torch import nn
>>> from memflow.strategy import Strategy
>>> model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2))
>>> s = Strategy(["0", "1", "2"], devices=[("gpu0",)] * 3).with_policy(
...     {"0": "recompute", "1": "recompute", "2": "offload"})
>>> exported = apply(model, s)
>>> x = torch.randn(4, 8)
>>> exported(x).sum().backward()
>>> model(x).sum().backward()
>>> all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(),
...                                                 exported.module.parameters()))
True
"""
from __future__ import annotations

import contextlib
import copy
from typing import Any, Mapping

import numpy as np
import torch
from torch import nn
from torch.utils import _pytree as pytree
from torch.utils.checkpoint import noop_context_fn

from ..errors import ExportError
from ..graph.units import LOSS, ROOT
from ..strategy.policies import KEEP, M_COMPRESSED, M_HOST, M_RECOMPUTE, M_SELECTIVE, POLICIES
from ..strategy.runnable import unrunnable
from .accumulation import accumulates, micro_batches
from .saved import SavedStore
from .placement import MoveTo, place, replica_devices, torch_devices
from .segment import Segment, storage_key
from .selective import graph_expensive_ops, selective_context
from .sharding import shard
from .spans import Span, check_modules, unit_spans
from .tracker import UnitTracker

__all__ = ["apply", "Exported"]


class Exported(nn.Module):
    """A model running one replica of a strategy; call it like the model.

    ``module`` is the wrapped model, ``strategy`` the strategy, ``devices`` the torch devices
    of each unit's parts in this replica. Build one with :func:`apply`.
    """

    def __init__(self, module: nn.Module, strategy, spans: list[Span],
                 devices: list[tuple[torch.device, ...]], expensive_ops: frozenset[str]):
        super().__init__()
        self._selective = selective_context(expensive_ops)
        self.module = module
        self.strategy = strategy
        self.spans = spans
        self.devices = devices
        self._policy = strategy.policy
        # export's hooks follow the mechanism: every policy on one mechanism runs the same way
        self._mechanism = POLICIES.mechanism_codes[strategy.policy]
        segment = strategy.segment
        self._segment_units: dict[int, list[int]] = {}
        for i in np.flatnonzero(segment >= 0).tolist():
            self._segment_units.setdefault(int(segment[i]), []).append(i)
        self._multi = len({d for devs in devices for d in devs}) > 1
        self._observe = bool(np.isin(self._mechanism, (M_HOST, M_COMPRESSED)).any())
        self._state: set[int] = set()
        self.store = SavedStore(self._state)
        self._open: list[Any] = []            # what unit starts set up, innermost last
        self.segments: list[Segment] = []     # segments of the forward running now
        self.tracker = UnitTracker(module, spans, self._start, self._end)

    # ------------------------------------------------------------------ running
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self._state.clear()
        self._state.update(storage_key(t) for t in [*self.module.parameters(),
                                                     *self.module.buffers()])
        self.store.reset(pytree.tree_leaves((args, kwargs)))
        m = self.strategy.microbatches
        try:
            if m == 1 or accumulates(self.strategy):     # one micro-batch per call
                return self._run(args, kwargs)
            return _concat([self._run(a, k) for a, k in micro_batches(args, kwargs, m)])
        finally:
            self.store.records.clear()        # the graph holds what backward needs

    def _run(self, args: tuple, kwargs: dict) -> Any:
        self.segments = []
        observe = self.store.observer() if self._observe else contextlib.nullcontext()
        with observe:
            try:
                with self.tracker.running():
                    out = self.module(*args, **kwargs)
            except BaseException:
                self._unwind()      # inside ``observe``: hook contexts leave in order
                raise
        segments, self.segments = self.segments, []     # their checkpoints hold them now
        for seg in segments:
            seg.check_inputs()
        return out

    def _unit_name(self) -> str:
        i = self.tracker.open
        return self.spans[i].name if i is not None else "?"

    def _start(self, i: int) -> None:
        mechanism = int(self._mechanism[i])
        units = self._segment_units.get(int(self.strategy.segment[i]), [])
        if mechanism in (M_RECOMPUTE, M_SELECTIVE) and units[0] == i:
            seg = Segment([self.spans[u].name for u in units],
                          sorted({d for u in units for d in self.devices[u]}, key=str),
                          self._unit_name, self._state,
                          self._selective if mechanism == M_SELECTIVE else noop_context_fn)
            seg.open()
            self.segments.append(seg)
            self._open.append(seg)
        elif mechanism == M_HOST:
            self._enter(self.store.offload())
        elif mechanism == M_COMPRESSED:
            self._enter(self.store.compress(float(self.strategy.error_bound[i])))
        if self._multi and len(self.devices[i]) == 1:
            self._enter(MoveTo(self.devices[i][0]))

    def _end(self, i: int) -> None:
        if self._multi and len(self.devices[i]) == 1:
            self._open.pop().__exit__(None, None, None)
        mechanism = int(self._mechanism[i])
        units = self._segment_units.get(int(self.strategy.segment[i]), [])
        if mechanism in (M_RECOMPUTE, M_SELECTIVE) and units[-1] == i:
            seg = self._open.pop()
            seg.close()
            for entry in seg.inputs if seg.saves else ():   # held by the checkpoint
                self.store.hold(entry.tensor)
        elif mechanism in (M_HOST, M_COMPRESSED):
            self._open.pop().__exit__(None, None, None)

    def _enter(self, ctx: Any) -> None:
        ctx.__enter__()
        self._open.append(ctx)

    def _unwind(self) -> None:
        while self._open:
            ctx = self._open.pop()
            if isinstance(ctx, Segment):
                ctx.abort()
            else:
                ctx.__exit__(None, None, None)

    def remove(self) -> nn.Module:
        """Take export's hooks off the model and return it (placement stays)."""
        self.tracker.remove()
        return self.module

    def extra_repr(self) -> str:
        counts = {POLICIES[c]: int((self._policy == c).sum()) for c in np.unique(self._policy)}
        return f"strategy={self.strategy.name!r}, policies={counts}"


def _concat(outputs: list[Any]) -> Any:
    flat = [pytree.tree_flatten(o) for o in outputs]
    leaves = []
    for parts in zip(*(f[0] for f in flat)):
        if isinstance(parts[0], torch.Tensor):
            if parts[0].dim() == 0:
                raise ExportError("with micro-batches the model's outputs are concatenated over "
                                  "the batch, but it returned a scalar tensor; return per-sample "
                                  "outputs and compute the loss outside the model")
            leaves.append(torch.cat(parts))
        else:
            leaves.append(parts[0])
    return pytree.tree_unflatten(leaves, flat[0][1])


def apply(model: nn.Module, strategy, graph=None, *, inplace: bool = False, replica: int = 0,
          devices: Mapping[str, str | torch.device] | None = None) -> Exported:
    """``model`` running replica ``replica`` of ``strategy``.

    ``graph`` (the :class:`~memflow.graph.OpGraph` the strategy was made for) tells which units
    are glue and checks the strategy against it; without it the units are read from their
    names (:mod:`memflow.export.spans`). ``devices`` maps the strategy's device names to torch
    devices (default: :func:`~memflow.export.placement.torch_devices`). Anything the strategy
    asks that PyTorch code cannot do raises :class:`~memflow.errors.ExportError` naming the
    unit.
    """
    if not isinstance(model, nn.Module):
        raise ExportError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    spans = unit_spans(strategy.units, graph)
    if graph is not None:
        strategy.validate(graph)
    for s in spans:
        if s.module == LOSS and strategy.policy[s.index] != KEEP:
            raise ExportError(f"unit {s.name!r} is the loss, which runs in your training loop, "
                              "not in the model; only 'keep' can be exported for it")
    reason = unrunnable(strategy, graph)
    if reason is not None:
        raise ExportError(reason)
    parts = replica_devices(strategy, replica,
                            torch_devices(strategy.device_names, devices))
    target = model if inplace else copy.deepcopy(model)
    modules = check_modules(target, spans)
    place(target, spans, modules, parts)
    _shard_units(target, strategy, spans, modules, parts)
    return Exported(target, strategy, spans, parts, graph_expensive_ops(graph))


def _shard_units(model: nn.Module, strategy, spans: list[Span], modules: dict[str, nn.Module],
                 parts: list[tuple[torch.device, ...]]) -> None:
    uses: dict[int, int] = {}
    for m in model.modules():
        for t in m.parameters(recurse=False):
            uses[id(t)] = uses.get(id(t), 0) + 1
    shared = {k for k, n in uses.items() if n > 1}
    for s in spans:
        if len(parts[s.index]) == 1:
            continue
        if s.role != "module":
            raise ExportError(f"unit {s.name!r} is glue (its module's own code), which export "
                              "cannot split over parameters; use parameter=1 for it")
        parent_path, _, attr = s.module.rpartition(".")
        if s.module == ROOT or s.call > 1:
            raise ExportError(f"unit {s.name!r}: export shards a module by replacing it in its "
                              "parent, which needs a submodule called once; use parameter=1")
        sharded = shard(s.name, modules[s.module], parts[s.index], shared)
        parent = modules[parent_path] if parent_path else model
        setattr(parent, attr, sharded)
        modules[s.module] = sharded
