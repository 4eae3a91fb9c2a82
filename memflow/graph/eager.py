"""Make capture's run on fake tensors the program an eager run on real tensors executes.

Model code asks "am I being traced?" and, if so, takes a branch an eager run never takes:
Hugging Face transformers treats a ``FakeTensor`` argument as tracing and then builds an
explicit causal mask and ``repeat_kv`` copies of keys and values for grouped-query attention
(a Llama's saved bytes +7%), because on a traced tensor it cannot read the attention mask to
see that it is all ones. An eager run reads it. Two things give capture the eager branch:

* :class:`KnownValues`, a dispatch mode under the recorder, carries the real contents of the
  small tensors that do not derive from weights — integer and boolean inputs and buffers
  (token ids, attention masks, positions) and what ops compute from them and from constants
  (``arange``, ``full``) — so that code reading them (``mask.all()``, ``.item()``,
  ``if (mask == 1).all():``, boolean indexing) gets the answer the real run gets. Values past
  :data:`VALUE_LIMIT` bytes, float inputs and everything computed from a weight stay unknown:
  activations are never computed, so capture still allocates nothing of the model's size.
* :func:`eager_predicates` answers a library's tracing predicate as an eager run would, for
  the duration of capture, for a tensor whose value is known. :data:`PREDICATES` lists every
  predicate patched, once. torch's own predicates (``torch.jit.is_tracing()``,
  ``torch.compiler.is_compiling()``) already answer ``False`` during capture: nothing is
  traced or compiled.

A tensor whose value is not known (inputs on the meta device) still looks traced, so the
library takes its tracing path: give capture real inputs to capture the eager program.

>>> import torch
>>> from torch._subclasses.fake_tensor import FakeTensorMode
>>> fake, values = FakeTensorMode(), KnownValues()
>>> with fake:
...     mask = torch.empty(2, 3, dtype=torch.long)
>>> values.add(mask, torch.ones(2, 3, dtype=torch.long))
>>> with fake, values:
...     bool((mask == 1).all())
True
"""
from __future__ import annotations

import contextlib
import importlib
import sys
from typing import Any, Callable, Iterator

import torch
from torch._subclasses.fake_tensor import DynamicOutputShapeException
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils.weak import WeakTensorKeyDictionary

__all__ = ["KnownValues", "eager_predicates", "PREDICATES", "VALUE_LIMIT"]

VALUE_LIMIT = 64 * 2 ** 20
"""Largest tensor (bytes) whose value capture computes; larger ones stay unknown."""


def _written(func, args: tuple, kwargs: dict) -> Iterator[torch.Tensor]:
    # the tensors an in-place or out= op writes into
    for i, a in enumerate(func._schema.arguments):
        if a.alias_info is not None and a.alias_info.is_write:
            value = args[i] if i < len(args) else kwargs.get(a.name)
            yield from (t for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor))


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class KnownValues(TorchDispatchMode):
    """Real values of the fake tensors that hold data, not activations (see module doc).

    Used between ``FakeTensorMode`` (below) and the recorder (above). An op whose tensor
    arguments all have values runs for real too (with no mode, no autograd) when its result is
    at most :data:`VALUE_LIMIT` bytes; an op returning a Python number (``.item()``,
    ``equal``) returns the real one. An in-place op that writes unknown data into a tensor
    makes every tensor on that storage unknown. Set :attr:`computing` to ``False`` once no
    code reads values any more (backward), so that nothing more is computed.
    """

    def __init__(self, limit: int = VALUE_LIMIT):
        super().__init__()
        self.limit = limit
        self.computing = True
        self._values = WeakTensorKeyDictionary()
        self._stale: dict[int, StorageWeakRef] = {}

    def add(self, fake: torch.Tensor, real: torch.Tensor) -> None:
        """``fake`` holds the values of ``real`` (kept as given: pass a copy to keep yours)."""
        if real.device.type != "meta" and _nbytes(real) <= self.limit:
            self._values[fake] = real

    def known(self, t: Any) -> bool:
        """Whether the value of tensor ``t`` is known."""
        if not isinstance(t, torch.Tensor) or t not in self._values:
            return False
        ref = self._stale.get(t.untyped_storage()._cdata)
        return ref is None or ref.expired()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.computing:
            return func(*args, **kwargs)
        flat = pytree.tree_leaves((args, kwargs))
        tensors = [t for t in flat if isinstance(t, torch.Tensor)]
        known = all(self.known(t) for t in tensors)
        if known and torch.Tag.data_dependent_output in func.tags:
            real = self._real(func, args, kwargs)
            if not any(isinstance(r, torch.Tensor) for r in pytree.tree_leaves(real)):
                return real                               # .item(), equal(): a Python value
        try:
            out = func(*args, **kwargs)
        except DynamicOutputShapeException:
            if func is torch.ops.aten.index.Tensor and not known:
                return func(args[0], self._positions(args[1]))
            if not known:
                raise
            # nonzero, boolean indexing: the real result gives the shape
            real = self._real(func, args, kwargs)
            out = pytree.tree_map_only(torch.Tensor, lambda r: torch.empty_strided(
                r.shape, r.stride(), dtype=r.dtype, device="cpu"), real)
            self._remember(out, real)
            return out
        outs = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        if known and sum(map(_nbytes, outs)) <= self.limit:
            self._remember(out, self._real(func, args, kwargs))
        else:
            for t in _written(func, args, kwargs):
                self._stale[t.untyped_storage()._cdata] = StorageWeakRef(t.untyped_storage())
        return out

    def _positions(self, indices: list) -> list:
        """Boolean masks of known value as the integer positions they select (``x[mask]``)."""
        out = []
        for index in indices:
            if index is not None and index.dtype in (torch.bool, torch.uint8):
                if not self.known(index):
                    raise DynamicOutputShapeException(torch.ops.aten.index.Tensor)
                reals = self._real(torch.ops.aten.unbind.int,
                                   (self._real(torch.ops.aten.nonzero.default, (index,), {}), 1),
                                   {})
                for real in reals:
                    fake = torch.empty_strided(real.shape, real.stride(), dtype=real.dtype,
                                               device="cpu")
                    self._values[fake] = real
                    out.append(fake)
            else:
                out.append(index)
        return out

    def _real(self, func, args: tuple, kwargs: dict) -> Any:
        real_args, real_kwargs = pytree.tree_map_only(
            torch.Tensor, lambda t: self._values.get(t, t), (args, kwargs))
        with _disable_current_modes(), torch.no_grad():
            return func(*real_args, **real_kwargs)

    def _remember(self, out: Any, real: Any) -> None:
        fakes, reals = pytree.tree_leaves(out), pytree.tree_leaves(real)
        for fake, value in zip(fakes, reals):
            if isinstance(fake, torch.Tensor) and isinstance(value, torch.Tensor):
                self._values[fake] = value
                self._stale.pop(fake.untyped_storage()._cdata, None)


def _transformers_is_fake_tensor(values: KnownValues, original: Callable) -> Callable:
    def is_fake_tensor(x: Any) -> bool:
        # transformers' is_tracing(tensor): a traced tensor is one whose value is unknown
        return original(x) and not values.known(x)
    return is_fake_tensor


PREDICATES: dict[tuple[str, str], Callable[[KnownValues, Callable], Callable]] = {
    ("transformers.utils.import_utils", "is_fake_tensor"): _transformers_is_fake_tensor,
}
"""Library predicate ``(module, name)`` -> its capture-time replacement's maker."""


@contextlib.contextmanager
def eager_predicates(values: KnownValues) -> Iterator[None]:
    """Answer the predicates of :data:`PREDICATES` as an eager run would, while it lasts.

    Only libraries already imported are patched (a model that uses one has imported it).

    >>> with eager_predicates(KnownValues()):
    ...     torch.compiler.is_compiling()
    False
    """
    patched = []
    try:
        for (module_name, name), make in PREDICATES.items():
            if module_name in sys.modules:
                module = importlib.import_module(module_name)
                original = getattr(module, name)
                setattr(module, name, make(values, original))
                patched.append((module, name, original))
        yield
    finally:
        for module, name, original in reversed(patched):
            setattr(module, name, original)

