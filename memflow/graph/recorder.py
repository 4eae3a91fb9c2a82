"""Recording one training step on fake tensors: units, op costs, storages and saved tensors.

A :class:`Recorder` is a ``TorchDispatchMode`` that sees every aten op the model runs (after
autograd, so the same ops a real backend launches) plus the hooks capture installs:

* forward pre/post hooks on every module keep a module stack; the *owner* of an op is the
  outermost selected module on the stack, else the innermost module (its glue);
* a maximal run of consecutive ops with the same owner call is one :class:`~.spans.Span` — one unit;
* every storage an op creates gets a :class:`Storage` record: producer, forward readers,
  savers (from ``saved_tensors_hooks``), whether a gradient flows into it and whether it
  descends from the batch (taint from the per-sample inputs through the ops that keep the
  batch, :mod:`~memflow.graph.batchdim`);
* storages are identified by their ``StorageImpl`` (views share it); parameters and buffers
  are :class:`Weight` records (every name of a tied weight, the spans that read it), never
  activations;
* a :class:`~memflow.graph.window.Window` follows the bytes a span allocates and frees (weak
  references to storages), for the transient peaks ``fwd_tmp_bytes``, ``bwd_tmp_bytes`` and
  ``unpack_tmp_bytes``;
* autograd nodes are tied to spans by sequence number (a node is numbered when its forward op
  runs), so backward ops land in the span whose forward made their node.
"""
from __future__ import annotations

import bisect
import warnings
from dataclasses import dataclass
from typing import Any, Iterable

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

from .backend import Backend
from .batchdim import keeps_batch
from .mapkind import kind_of
from .opcost import OpCounter, tensors_in
from .selective import EXPENSIVE_OPS, is_expensive, unreplayable_write
from .spans import Span, Storage, Weight
from .units import LOSS, ROOT
from .window import Window

__all__ = ["Recorder"]

_ACCUMULATE = 2 ** 64 - 1       # sequence number of AccumulateGrad nodes (run as soon as ready)


def _key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


@dataclass(eq=False)
class _Frame:
    path: str
    kind: str
    role: str
    instance: int


class Recorder(TorchDispatchMode):
    """Records spans, costs, storages and saves of one forward and backward (see module doc)."""

    def __init__(self, backend: Backend, counter: OpCounter, selected: set[str],
                 paths: dict[nn.Module, str], batch_size: int,
                 expensive_ops: frozenset[str] = EXPENSIVE_OPS, units: list[str] | None = None):
        super().__init__()
        self.expensive_ops = expensive_ops
        # another pass's unit names, in order: a span opens only as the next of them, so that
        # ops a cast adds where that pass ran none (a bf16 model's ``.float()`` in glue) stay
        # in the unit running before them, and the two passes have the same units
        self.units = units
        self.backend = backend
        self.counter = counter
        self.selected = selected
        self.paths = paths
        self.batch_size = batch_size
        self.spans: list[Span] = []
        self.storages: list[Storage] = []
        self.weights: dict[int, Weight] = {}
        self.phase: str | None = None          # "forward", "backward" or None (not recording)
        self._live: dict[int, Storage] = {}
        self._stack: list[_Frame] = []
        self._owner: _Frame | None = None
        self._loss: _Frame | None = None
        self._instances = 0
        self._calls: dict[str, int] = {}
        self._current: Span | None = None      # last span opened in forward
        self._window = Window()
        self._seq_his: list[int] = []
        self._bwd_span: Span | None = None
        self._read_expensive: set[Storage] = set()     # expensive outputs read out of place
        # what the memory model frees when a span's backward ends, PyTorch frees during it
        # (credits of the span's backward window): the storages it saved first …
        self._held: dict[int, list[tuple[StorageWeakRef, int]]] = {}
        # … and the gradients earlier backward windows left alive (it consumes its own)
        self._grads: dict[StorageWeakRef, int] = {}
        self._param_grads: dict[int, tuple[StorageWeakRef, int]] = {}   # by parameter: never a credit
        # floating bytes each autograd node saved, by the sequence counter while it packs
        # (its number + 1): what its backward unpacks at once
        self._unpacks: dict[int, int] = {}

    # ------------------------------------------------------------------ module stack
    def _frame(self, path: str, kind: str, role: str) -> _Frame:
        self._instances += 1
        return _Frame(path, kind, role, self._instances)

    def pre_hook(self, module: nn.Module, args: Any) -> None:
        """Forward pre-hook: ``module`` starts running."""
        path = self.paths[module]
        role = "module" if path in self.selected else "glue"
        self._stack.append(self._frame(path, type(module).__name__, role))
        self._update_owner()

    def post_hook(self, module: nn.Module, args: Any, output: Any) -> None:
        """Forward hook: ``module`` returned; what it returned is its unit's main output."""
        if self._stack:
            frame = self._stack.pop()
            span = self._current
            if span is not None and span.owner == frame.instance:
                first = next(tensors_in(output), None)
                if first is not None:
                    span.main_out = (str(first.dtype).replace("torch.", ""), tuple(first.shape))
        self._update_owner()

    def _update_owner(self) -> None:
        for frame in self._stack:
            if frame.role == "module":
                self._owner = frame
                return
        self._owner = self._stack[-1] if self._stack else self._loss

    @property
    def innermost(self) -> str | None:
        """Path of the innermost module running (after an exception: where it was raised)."""
        return self._stack[-1].path if self._stack else None

    def begin_loss(self) -> None:
        """Ops from now on form the ``<loss>`` unit."""
        self._loss = self._frame(LOSS, "Loss", "glue")
        self._update_owner()

    def end_loss(self) -> None:
        self._loss = None
        self._update_owner()

    # ------------------------------------------------------------------ storages
    def _lookup(self, key: int) -> Storage | None:
        rec = self._live.get(key)
        if rec is not None and rec.ref.expired():      # the address now holds a new storage
            del self._live[key]
            return None
        return rec

    def _storage_of(self, t: torch.Tensor) -> Storage | None:
        return self._lookup(_key(t))

    def _new_storage(self, t: torch.Tensor, producer: int, tainted: bool) -> Storage:
        storage = t.untyped_storage()
        rec = Storage(storage.nbytes(), producer, str(t.dtype).replace("torch.", ""),
                      tuple(t.shape), StorageWeakRef(storage), tainted,
                      kind=kind_of("", (), t.is_floating_point()))
        self._live[storage._cdata] = rec
        self.storages.append(rec)
        return rec

    def add_input(self, t: torch.Tensor) -> None:
        """Register a model input; it is per-sample when its first dimension is the batch."""
        if _key(t) in self._live:
            return
        per_sample = t.dim() > 0 and t.shape[0] == self.batch_size
        self._new_storage(t, -1, per_sample).requires_grad = t.requires_grad

    def add_weight(self, t: torch.Tensor, names: list[str], is_buffer: bool) -> None:
        """Register a parameter or buffer known by ``names`` (never an activation)."""
        key = _key(t)
        if key not in self.weights:
            module = names[0].rsplit(".", 1)[0] if "." in names[0] else ROOT
            self.weights[key] = Weight(list(names), t.numel(), t.untyped_storage().nbytes(),
                                       str(t.dtype).replace("torch.", ""),
                                       bool(t.requires_grad), is_buffer, module)

    def mark_outputs(self, outputs: Iterable[torch.Tensor]) -> None:
        """The model returned ``outputs`` (what the loss reads; ``is_output`` in the graph)."""
        for t in outputs:
            rec = self._lookup(_key(t))
            if rec is not None:
                rec.is_output = True
                rec.requires_grad |= t.requires_grad

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        """``saved_tensors_hooks`` pack hook: the recorded op saves ``t`` for backward."""
        # Autograd packs an op's inputs before the op dispatches: ask the module stack.
        span = self._forward_span() if self.phase == "forward" else None
        if span is not None:
            key = _key(t)
            if key not in self.weights:
                rec = self._lookup(key) or self._new_storage(t, span.index, False)
                if not rec.savers or rec.savers[-1] != span.index:
                    rec.savers.append(span.index)
                rec.requires_grad |= t.requires_grad
                if t.is_floating_point():       # what a compress unit packs, view by view
                    seq = torch._C._autograd._get_sequence_nr()
                    self._unpacks[seq] = self._unpacks.get(seq, 0) + t.numel() * t.element_size()
        return t

    # ------------------------------------------------------------------ spans
    def _span_name(self, owner: _Frame) -> tuple[str, int]:
        call = self._calls.get(owner.path, 0) + 1
        return (owner.path if call == 1 else f"{owner.path}#{call}"), call

    def _opens(self, owner: _Frame) -> bool:
        """Whether ``owner``'s ops open a span (always, unless following :attr:`units`)."""
        if self.units is None or self._current is None:
            return True
        n = len(self.spans)
        return n < len(self.units) and self.units[n] == self._span_name(owner)[0]

    def _open_span(self, owner: _Frame) -> Span:
        if self._current is not None:
            self._current.fwd_tmp = self._window.close()
        name, call = self._span_name(owner)
        self._calls[owner.path] = call
        span = Span(len(self.spans), name, owner.path, owner.kind, owner.role, call,
                    owner.instance)
        self.spans.append(span)
        self._current = span
        self._window = Window()
        return span

    def _forward_span(self) -> Span | None:
        owner = self._owner
        if owner is None:
            return None
        span = self._current
        if span is None or (span.owner != owner.instance and self._opens(owner)):
            span = self._open_span(owner)
        span.seq_hi = torch._C._autograd._get_sequence_nr()
        return span

    def finish_forward(self) -> None:
        """The forward (and loss) ended: close the last span."""
        if self._current is not None:
            self._current.fwd_tmp = self._window.close()
        self._seq_his = [s.seq_hi for s in self.spans]
        self._window = Window()
        for rec in self.storages:
            if rec.savers and not rec.ref.expired():
                self._held.setdefault(min(rec.savers), []).append((rec.ref, rec.nbytes))

    def parameter_gradient(self, param: torch.Tensor) -> None:
        """Post-accumulate-grad hook: ``param.grad`` is a parameter gradient, which lives
        to the optimizer step (the memory model's), not an activation gradient."""
        storage = param.grad.untyped_storage()
        ref = StorageWeakRef(storage)
        old = self._param_grads.get(id(param))
        if old is not None and old[0].expired():     # replaced by the sum with a contribution
            self._window.credit(old[1])
        self._param_grads[id(param)] = (ref, storage.nbytes())
        self._grads.pop(ref, None)

    def _backward_span(self) -> Span | None:
        node = torch._C._current_autograd_node()
        seq = node._sequence_nr() if node is not None else _ACCUMULATE
        if seq == _ACCUMULATE:
            span = self._bwd_span
        else:
            i = bisect.bisect_right(self._seq_his, seq)
            span = self.spans[i] if i < len(self.spans) else None
        if span is not self._bwd_span:
            self.finish_backward()
            self._bwd_span = span
            if span is not None:
                self._window = Window(self._grads.items(), self._held.get(span.index, ()))
        self._window.unpack(seq, 0 if seq == _ACCUMULATE else self._unpacks.get(seq + 1, 0))
        return span

    def finish_backward(self) -> None:
        """Close the backward window of the span that ran last; the gradients it made that
        outlive it (but parameter gradients) are credits of the windows after it."""
        if self._bwd_span is not None:
            self._bwd_span.bwd_tmp = max(self._bwd_span.bwd_tmp, self._window.close_backward())
            unpack_tmp = self._window.close_unpacked()
            if unpack_tmp > self._bwd_span.unpack_tmp:
                self._bwd_span.unpack_tmp = unpack_tmp
                self._bwd_span.unpack_done = self._window.done_at_peak
            params = {ref for ref, _ in self._param_grads.values()}
            self._grads = {ref: n for ref, n in self._grads.items() if not ref.expired()}
            self._grads.update((ref, n) for ref, n in self._window.items
                               if ref not in params)
        self._window = Window()

    def estimate_backward(self, err: Exception) -> None:
        """Backward failed on fake tensors: estimate every unit's backward as twice its forward
        (said once: a pass following another's units is not told again)."""
        if self.units is None:
            warnings.warn(f"capture could not run backward on fake tensors "
                          f"({type(err).__name__}: {err}); backward FLOPs, bytes and ops are "
                          "estimated as 2x forward and bwd_tmp_bytes as fwd_tmp_bytes",
                          stacklevel=3)
        for s in self.spans:
            s.bwd_flops, s.bwd_bytes, s.bwd_ops = 2 * s.fwd_flops, 2 * s.fwd_bytes, 2 * s.fwd_ops
            s.bwd_tmp = s.fwd_tmp
        self._bwd_span = None
        self._window = Window()

    # ------------------------------------------------------------------ ops
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        device = kwargs.get("device")
        if device is not None and torch.device(device).type != "cpu":
            # Code written for a GPU (.cuda(), device="cuda") runs on the fake CPU tensors:
            # a fake CUDA tensor would abort autograd in a CPU build of torch.
            kwargs = {**kwargs, "device": torch.device("cpu")}
        if self.phase is None or func.namespace == "prim":
            return func(*args, **kwargs)
        forward = self.phase == "forward"
        span = self._forward_span() if forward else self._backward_span()
        if span is None:
            return func(*args, **kwargs)
        self._window.poll()
        out = self.backend.fix_output(func, args, kwargs, func(*args, **kwargs))
        cost = self.counter.cost(func, args, kwargs, out)
        outs = list(tensors_in(out))
        if forward:
            span.fwd_flops += cost.flops
            span.fwd_bytes += cost.bytes_moved
            span.fwd_ops += cost.kernels
            expensive = is_expensive(func, self.expensive_ops)
            if expensive:
                span.expensive_flops += cost.flops
                span.expensive_bytes += cost.bytes_moved
                span.expensive_ops += cost.kernels
            if cost.shape is not None:
                span.kernels[cost.shape[:4]] = span.kernels.get(cost.shape[:4], 0) + cost.shape[4]
            written = unreplayable_write(func, args, _EXPENSIVE, self._read_expensive,
                                         self._storage_of)
            if written is not None:          # neither the writer nor the producer replays
                span.selective_replays = False
                if written.producer >= 0:
                    self.spans[written.producer].selective_replays = False
            self._track_forward(span, func, args, kwargs, outs, expensive)
        else:
            span.bwd_flops += cost.flops
            span.bwd_bytes += cost.bytes_moved
            span.bwd_ops += cost.kernels
            self._track_backward(args, kwargs, outs)
        return out

    def _track_forward(self, span: Span, func, args: tuple, kwargs: dict,
                       outs: list[torch.Tensor], expensive: bool = False) -> None:
        source = None                  # the first per-sample tensor the op reads
        kinds = []                     # the map kinds of the floating activations it reads
        for t in (*tensors_in(args), *tensors_in(kwargs)):
            key = _key(t)
            weight = self.weights.get(key)
            if weight is not None:
                if not weight.readers or weight.readers[-1] != span.index:
                    weight.readers.append(span.index)
                span.reads_params |= not weight.is_buffer
                continue
            rec = self._lookup(key)
            if rec is None:
                continue
            if not rec.consumers or rec.consumers[-1] != span.index:
                rec.consumers.append(span.index)
            rec.requires_grad |= t.requires_grad
            if source is None and rec.tainted:
                source = t
            if t.is_floating_point():
                kinds.append(rec.kind)
        name = func.overloadpacket.__name__
        writes = func._schema.is_mutable       # in place (or out=): the storage takes its kind
        for i, t in enumerate(outs):
            key = _key(t)
            if key in self.weights:
                continue
            tainted = source is not None and keeps_batch(func, args, kwargs, source, i, t,
                                                         self.batch_size)
            rec = self._lookup(key)
            if rec is None:
                rec = self._new_storage(t, span.index, tainted)
                rec.expensive = expensive
                rec.kind = kind_of(name, kinds, t.is_floating_point())
                self._window.add(rec.ref, rec.nbytes)
            else:
                if tainted:                    # written in place from per-sample data
                    rec.tainted = True
                if writes:
                    rec.kind = kind_of(name, kinds, t.is_floating_point())
        if outs:
            span.last_out = (str(outs[0].dtype).replace("torch.", ""), tuple(outs[0].shape))

    def _track_backward(self, args: tuple, kwargs: dict, outs: list[torch.Tensor]) -> None:
        seen = {_key(t) for t in (*tensors_in(args), *tensors_in(kwargs))}
        for t in outs:
            key = _key(t)
            if key not in seen:
                seen.add(key)
                storage = t.untyped_storage()
                self._window.add(StorageWeakRef(storage), storage.nbytes())


class _Expensive:
    """The storage records an expensive op made, as a container (what a selective unit keeps)."""

    def __contains__(self, rec: object) -> bool:
        return isinstance(rec, Storage) and rec.expensive


_EXPENSIVE = _Expensive()
