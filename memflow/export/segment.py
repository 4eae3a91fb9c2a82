"""Recompute segments: one non-reentrant checkpoint over any run of consecutive units.

``torch.utils.checkpoint(fn, use_reentrant=False)`` needs the segment as a function. A segment
of units is a stretch of the forward — it may begin in a module's glue and end inside another
module — so :class:`Segment` opens the checkpoint when the segment's first unit starts and
closes it when its last unit ends, with the very generator ``torch.utils.checkpoint`` runs
between its two ``next`` calls (same saved-tensor holders, RNG and autocast restore, early
stop and shape check). What the checkpoint must replay in backward is recorded on the way:

* a ``TorchFunctionMode`` records each top-level torch call of the segment (``F.linear``,
  ``x + y``, ``x[:, 0] = 0``...) with its arguments: tensors made inside the segment as
  references to the call that made them, others (the segment's inputs) held strongly —
  exactly "storages produced outside the segment and read inside it are held" of the memory
  model — and parameters and buffers by reference; calls that return no tensor (``x.shape``)
  are pure and left out, so reading a shape holds nothing;
* replay re-runs the calls in order under the recorded grad mode and frees each result after
  its last use, as the memory model's recomputation does;
* in-place writes to a segment input are checked: one that saves nothing for backward is
  replayed as the value it left (the input already holds it); ``relu_``-like ones (applying
  them twice changes nothing) are replayed out of place; any other, or a read of the input
  before the write, is an :class:`~memflow.errors.ExportError` naming the unit, since replay
  could not see the value the forward saw. Buffers written in place (batch-norm running
  statistics) are replayed on a scratch copy, so recomputation does not update them twice.

>>> import torch
>>> from torch import nn
>>> lin = nn.Linear(4, 4)
>>> x = torch.randn(2, 4)
>>> seg = Segment(["lin"], [torch.device("cpu")], lambda: "lin", set())
>>> seg.open()
>>> y = torch.tanh(lin(x)) * 2
>>> seg.close()
>>> y.sum().backward()                       # replays linear, tanh and mul
>>> [c.name for c in seg.calls]
['linear', 'tanh', 'mul']
"""
from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils.checkpoint import _checkpoint_without_reentrant_generator, noop_context_fn

from ..errors import ExportError

__all__ = ["Segment", "storage_key"]

# In-place calls that give the same result when applied to their own result (relu(relu(x)) =
# relu(x)), by name, with their out-of-place form (taking the call's arguments).
_F = torch.nn.functional
_IDEMPOTENT: dict[str, Callable] = {
    "relu_": lambda x, *a, **k: torch.relu(x),
    "relu": lambda x, *a, **k: torch.relu(x),
    "relu6": lambda x, *a, **k: _F.relu6(x),
    "hardtanh": lambda x, min_val=-1.0, max_val=1.0, *a, **k: _F.hardtanh(x, min_val, max_val),
    "hardtanh_": lambda x, min_val=-1.0, max_val=1.0, *a, **k: _F.hardtanh(x, min_val, max_val),
    "clamp_": lambda x, min=None, max=None: torch.clamp(x, min, max),
    "clip_": lambda x, min=None, max=None: torch.clamp(x, min, max),
}
# Calls that update buffers (running statistics) in place without bumping their version.
_WRITES_BUFFERS = {"batch_norm", "instance_norm"}
_RUN, _SKIP, _OUT_OF_PLACE = range(3)


def storage_key(t: torch.Tensor) -> int:
    """Identity of ``t``'s storage (views share it)."""
    return t.untyped_storage()._cdata


@dataclass(eq=False)
class _Input:
    """A tensor from outside the segment, held until the segment's backward."""

    tensor: torch.Tensor
    read: bool = False          # read as data (not only viewed) by a recorded call
    sealed: int = -1            # version when the segment closed


@dataclass(frozen=True)
class _State:
    """A parameter or buffer argument; ``scratch`` when the call writes it in place."""

    tensor: torch.Tensor
    scratch: bool


@dataclass(eq=False)
class _Call:
    func: Callable
    name: str
    leaves: list[Any]           # (call, leaf) keys, _Input, _State or constants
    spec: Any
    grad: bool
    kind: int = _RUN
    bind: list[int] = field(default_factory=list)   # _SKIP: output leaf j is argument leaf bind[j]
    out_spec: Any = None
    frees: list[tuple[int, int]] = field(default_factory=list)   # results last read here
    kept: set[int] = field(default_factory=set)                  # results read later


def _saves_for_backward(outputs: list[torch.Tensor]) -> bool:
    for t in outputs:
        node = t.grad_fn
        if node is not None and any(a.startswith("_raw_saved_") and getattr(node, a) is not None
                                    for a in dir(node)):
            return True
    return False


def _call_name(func: Callable) -> str:
    if isinstance(func, torch._ops.OpOverload):     # a traced stage calls aten.relu_.default
        return func.overloadpacket.__name__
    name = getattr(func, "__name__", None)
    if name == "__get__":       # a property such as Tensor.T
        name = getattr(getattr(func, "__self__", None), "__name__", "property")
    return str(name or type(func).__name__)


class _Recorder(TorchFunctionMode):
    def __init__(self, segment: "Segment"):
        super().__init__()
        self.seg = segment
        self.made: dict[int, tuple[weakref.ref, tuple[int, int]]] = {}
        self.inputs: dict[int, _Input] = {}
        self.seq_start = torch._C._autograd._get_sequence_nr()

    def _internal(self, t: torch.Tensor) -> tuple[int, int] | None:
        hit = self.made.get(id(t))
        return hit[1] if hit is not None and hit[0]() is t else None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        leaves, spec = pytree.tree_flatten((args, kwargs))
        tensors = [(i, x) for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
        before = [(x, x._version) for _, x in tensors]
        held = [(e, e.tensor._version) for e in self.inputs.values()]
        out = func(*args, **kwargs)
        outs, out_spec = pytree.tree_flatten(out)
        if out is not None and not any(isinstance(o, torch.Tensor) for o in outs):
            return out          # a query (shape, item, dim): pure, nothing to replay
        self._record(func, leaves, spec, tensors, before, held, out, outs, out_spec)
        return out

    def _record(self, func, leaves, spec, tensors, before, held, out, outs, out_spec) -> None:
        seg = self.seg
        name = _call_name(func)
        call = _Call(func, name, list(leaves), spec, torch.is_grad_enabled())
        index = len(seg.calls)
        out_keys = {storage_key(o) for o in outs if isinstance(o, torch.Tensor)}
        written_inputs = {id(e) for e, v in held if e.tensor._version != v}
        for (i, x), (_, v0) in zip(tensors, before):
            key = self._internal(x)
            if key is not None:
                call.leaves[i] = key
                self._check_custom(x)
            elif storage_key(x) in seg.state:
                written = x._version != v0 or name in _WRITES_BUFFERS
                call.leaves[i] = _State(x, scratch=written and not isinstance(x, nn.Parameter))
            else:
                entry = self.inputs.get(id(x))
                if entry is None:
                    entry = self.inputs[id(x)] = _Input(x)
                    if x._version != v0:
                        written_inputs.add(id(entry))
                call.leaves[i] = entry
                if id(entry) not in written_inputs and storage_key(x) not in out_keys:
                    entry.read = True
        if written_inputs:
            self._replay_write(call, [e for e in self.inputs.values() if id(e) in written_inputs],
                               tensors, outs)
        call.out_spec = out_spec
        for j, o in enumerate(outs):
            if isinstance(o, torch.Tensor):
                self.made[id(o)] = (weakref.ref(o), (index, j))
        seg.calls.append(call)

    def _replay_write(self, call: _Call, written: list[_Input], tensors, outs) -> None:
        """How to replay a call that wrote a segment input in place (see the module doc)."""
        unit = self.seg.unit_of()
        if any(e.read for e in written):
            raise ExportError(
                f"unit {unit!r} writes in place ({call.name}) a tensor from before its recompute "
                "segment that the segment read earlier; recomputation would read the written "
                "value. Start the segment at the unit that makes this tensor, or keep this unit")
        if not _saves_for_backward([o for o in outs if isinstance(o, torch.Tensor)]):
            arg_of = {id(x): i for i, x in tensors}
            if not all(id(o) in arg_of for o in outs if isinstance(o, torch.Tensor)):
                raise ExportError(f"unit {unit!r}: in-place call {call.name} returned a new "
                                  "tensor; recompute cannot replay it. Keep this unit")
            call.kind = _SKIP
            call.bind = [arg_of.get(id(o), -1) for o in outs]
        elif call.name in _IDEMPOTENT:
            call.kind = _OUT_OF_PLACE
        else:
            raise ExportError(
                f"unit {unit!r} writes in place ({call.name}) a tensor made before its recompute "
                "segment and saves it for backward; recomputation cannot recreate the value. "
                "Start the segment at the unit that makes this tensor, or keep this unit")

    def _check_custom(self, t: torch.Tensor) -> None:
        node = t.grad_fn
        if isinstance(node, torch.autograd.function.BackwardCFunction) and \
                node._sequence_nr() >= self.seq_start:
            raise ExportError(
                f"unit {self.seg.unit_of()!r} runs a custom autograd Function "
                f"({type(node).__name__}); recompute replays torch calls and cannot replay it. "
                "Give this unit another policy (keep, offload, compress)")


def _frame_saves(gen) -> bool:
    """Whether the checkpoint running in ``gen`` packed a saved tensor.

    Non-reentrant checkpoint holds the segment's inputs only through the graph's saved tensors
    (each one's pack hook registers a holder on the checkpoint's frame): a segment that saved
    nothing holds nothing after its forward and never recomputes. Where this torch keeps no
    such frame, assume it saved something (counting its inputs as held).
    """
    frame = getattr(gen, "gi_frame", None)
    holders = getattr(frame.f_locals.get("new_frame"), "weak_holders", None) if frame else None
    return holders is None or len(holders) > 0


class Segment:
    """One recompute segment (``units``, for messages) running on ``devices``.

    :meth:`open` when its first unit starts, :meth:`close` when its last unit ends;
    ``unit_of()`` names the unit running now (for errors); ``state`` holds the storage keys
    of the model's parameters and buffers; ``context_fn`` is the checkpoint's (a selective
    policy's: :mod:`memflow.export.selective`).
    """

    def __init__(self, units: Sequence[str], devices: Sequence[torch.device],
                 unit_of: Callable[[], str], state: set[int],
                 context_fn: Callable = noop_context_fn):
        self.units = list(units)
        self.context_fn = context_fn        # selective checkpointing's, for selective units
        self.devices = list(devices)
        self.unit_of = unit_of
        self.state = state
        self.calls: list[_Call] = []
        self.inputs: list[_Input] = []          # tensors from before the segment it holds
        self.saves = False                      # whether autograd saved anything in it
        self._recorder: _Recorder | None = None
        self._gen = None

    def open(self) -> None:
        """Start the checkpoint and the recording (nothing to do when grad is off)."""
        self.calls, self.inputs = [], []
        if not torch.is_grad_enabled():
            return
        # Empty tensors on the segment's devices tell checkpoint whose RNG state to restore.
        anchors = [torch.empty(0, device=d) for d in self.devices]
        # A selective checkpoint replays to its end: stopping early, once the last saved
        # tensor is back, leaves the outputs of expensive ops from there on (a head's
        # logits) in its cache until the whole segment's backward ends; replayed, the cache
        # hands them over and they go, as the memory model frees them.
        early_stop = self.context_fn is noop_context_fn
        self._gen = _checkpoint_without_reentrant_generator(
            self._replay, True, self.context_fn, "default", False, early_stop, *anchors)
        next(self._gen)
        self._recorder = _Recorder(self)
        self._recorder.__enter__()

    def close(self) -> None:
        """End the recording and the checkpoint; plan when replay frees each result."""
        if self._recorder is None:
            return
        recorder, self._recorder = self._recorder, None
        recorder.__exit__(None, None, None)
        self.inputs = list(recorder.inputs.values())
        for entry in self.inputs:
            entry.sealed = entry.tensor._version
        self._plan_frees()
        gen, self._gen = self._gen, None
        self.saves = _frame_saves(gen)
        try:
            next(gen)
        except StopIteration:
            return
        raise AssertionError("torch.utils.checkpoint's generator yielded more than twice")

    def abort(self) -> None:
        """The forward raised inside the segment: unwind the checkpoint's contexts."""
        if self._recorder is not None:
            self._recorder.__exit__(None, None, None)
            self._recorder = None
        if self._gen is not None:
            self._gen.close()
            self._gen = None

    def check_inputs(self) -> None:
        """Raise if a segment input the replay reads was written after the segment."""
        for entry in self.inputs:
            if entry.read and entry.tensor._version != entry.sealed:
                raise ExportError(
                    f"recompute segment {self.units[0]!r}..{self.units[-1]!r}: a tensor it "
                    "reads was written in place after the segment, so recomputation would "
                    "see another value. End the segment before that write, or keep it")

    def _plan_frees(self) -> None:
        last: dict[tuple[int, int], int] = {}
        for i, call in enumerate(self.calls):
            for leaf in call.leaves:
                if isinstance(leaf, tuple):
                    last[leaf] = i
        for (made, j), i in last.items():
            self.calls[i].frees.append((made, j))
            self.calls[made].kept.add(j)

    def _unmatched(self) -> Any:
        """Around what replay runs that the forward did not (a scratch copy of a buffer, the
        out-of-place form of ``relu_``): a selective checkpoint matches the replay's ops one by
        one with the forward's, so these run outside its dispatch mode."""
        if self.context_fn is noop_context_fn:
            return contextlib.nullcontext()
        return _disable_current_modes()

    def _replay(self, *anchors: torch.Tensor) -> None:
        self.check_inputs()
        values: dict[tuple[int, int], Any] = {}
        for i, call in enumerate(self.calls):
            leaves = []
            for x in call.leaves:
                if isinstance(x, _State) and x.scratch:
                    with self._unmatched():
                        x = x.tensor.clone()
                leaves.append(values[x] if isinstance(x, tuple) else
                              x.tensor if isinstance(x, (_Input, _State)) else x)
            with torch.set_grad_enabled(call.grad):
                if call.kind == _SKIP:
                    outs = [leaves[b] if b >= 0 else None for b in call.bind]
                elif call.kind == _OUT_OF_PLACE:
                    args, kwargs = pytree.tree_unflatten(leaves, call.spec)
                    with self._unmatched():
                        outs = pytree.tree_leaves(_IDEMPOTENT[call.name](*args, **kwargs))
                else:
                    args, kwargs = pytree.tree_unflatten(leaves, call.spec)
                    outs = pytree.tree_leaves(call.func(*args, **kwargs))
            for key in call.frees:
                del values[key]
            for j in call.kept:
                values[(i, j)] = outs[j]
