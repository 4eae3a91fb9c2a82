"""Capture a PyTorch model into an :class:`~memflow.graph.OpGraph`: :func:`from_torch`.

The model runs once, forward and backward, on fake tensors (``FakeTensorMode``): every shape,
dtype and autograd decision is real, nothing is allocated, and the user's module is left as it
was (its parameters are swapped for fake copies with ``torch.func.functional_call`` for the
duration of the call; hooks are removed afterwards). No tracing is involved, so Python control
flow, shape arithmetic and Hugging Face models capture as they run; integer and boolean inputs
keep their values, so code that reads a mask takes the branch an eager run takes
(:mod:`memflow.graph.eager`).

>>> import torch
>>> from torch import nn
>>> model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
>>> g = from_torch(model, torch.randn(8, 16))
>>> g.names
['0', '1', '2']
>>> g.units[["params", "saved_bytes", "fwd_flops"]]
      params  saved_bytes  fwd_flops
unit
0        544          512     8192.0
1          0         1024      256.0
2        132            0     2048.0

The saved activations are the input (8×16 float32, saved by ``0`` for its weight gradient)
and the ReLU output, saved by ``1`` and by ``2`` but counted once, in ``1``, the first saver.
"""
from __future__ import annotations

import contextlib
import logging
import warnings
from typing import Any, Callable, Iterable, Iterator, Mapping

import pandas as pd
import torch
from torch import nn
from torch._subclasses.fake_tensor import (DataDependentOutputException,
                                           DynamicOutputShapeException, FakeTensorMode)
from torch.func import functional_call
from torch.utils import _pytree as pytree

from ..errors import CaptureError
from .autocast import AMP_DTYPE, parse_autocast
from .backend import Backend, get_backend
from .compute import COMPUTE_DTYPE, cast_buffer_names, upcast
from .eager import KnownValues, eager_predicates
from .opcost import OpCounter
from .opgraph import OpGraph
from .recorder import Recorder
from .selective import EXPENSIVE_OPS
from .tables import pass_graph, parameter_table, tensor_table, unit_table
from .units import describe_units, enclosing_blocks, module_paths, select_units

__all__ = ["from_torch", "split_inputs", "describe_inputs"]

_EXPECTS = (("in_features", "a last dimension of"), ("in_channels", "a channel dimension of"),
            ("input_size", "a feature dimension of"), ("normalized_shape", "trailing dimensions"),
            ("num_embeddings", "indices below"), ("embed_dim", "an embedding dimension of"))


def split_inputs(example_inputs: Any) -> tuple[tuple, dict]:
    """``(args, kwargs)`` for the model from a tensor, a tuple/list or a dict of inputs.

    >>> split_inputs(torch.ones(2))[0][0].shape
    torch.Size([2])
    >>> split_inputs("x")
    Traceback (most recent call last):
    ...
    memflow.errors.CaptureError: example_inputs must be a tensor, a tuple or list of positional inputs, or a dict of keyword inputs; got str
    """
    if isinstance(example_inputs, torch.Tensor):
        args, kwargs = (example_inputs,), {}
    elif isinstance(example_inputs, (tuple, list)):
        args, kwargs = tuple(example_inputs), {}
    elif isinstance(example_inputs, Mapping):
        args, kwargs = (), dict(example_inputs)
    else:
        raise CaptureError("example_inputs must be a tensor, a tuple or list of positional "
                           "inputs, or a dict of keyword inputs; got "
                           f"{type(example_inputs).__name__}")
    if not any(isinstance(t, torch.Tensor) for t in pytree.tree_leaves((args, kwargs))):
        raise CaptureError("example_inputs hold no tensor; give the model's inputs (e.g. a batch "
                           "of images or token ids) as tensors, on any device (meta is fine)")
    return args, kwargs


def describe_inputs(args: tuple, kwargs: dict) -> list[dict[str, Any]]:
    """Name, shape and dtype of every tensor input (for ``graph.meta["inputs"]``).

    >>> describe_inputs((torch.ones(2, 3),), {"mask": torch.ones(2, dtype=torch.bool)})
    [{'name': 'args[0]', 'shape': [2, 3], 'dtype': 'float32'}, {'name': 'mask', 'shape': [2], 'dtype': 'bool'}]
    """
    items = [(f"args[{i}]", a) for i, a in enumerate(args)] + list(kwargs.items())
    out = []
    for name, value in items:
        leaves = pytree.tree_leaves(value)
        for j, t in enumerate(leaves):
            if isinstance(t, torch.Tensor):
                out.append({"name": name if len(leaves) == 1 else f"{name}[{j}]",
                            "shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", "")})
    return out


def _batch_size(args: tuple, kwargs: dict) -> int:
    for t in pytree.tree_leaves((args, kwargs)):
        if isinstance(t, torch.Tensor):
            return int(t.shape[0]) if t.dim() else 1
    return 1


def _fake_like(t: torch.Tensor, cast: torch.dtype | None = None) -> torch.Tensor:
    # Called inside FakeTensorMode: a tensor of the same layout with no data (a floating one
    # in ``cast`` when given), a leaf as the parameter is.
    dtype = cast if cast is not None and t.is_floating_point() else t.dtype
    fake = torch.empty_strided(t.shape, t.stride(), dtype=dtype, device="cpu")
    return fake.requires_grad_(t.requires_grad) if t.is_floating_point() or t.is_complex() \
        else fake


def _fake_inputs(args: tuple, kwargs: dict,
                 cast: torch.dtype | None = None) -> tuple[tuple, dict]:
    """Fake inputs (inside FakeTensorMode) that share storages as the real ones do; floating
    ones in ``cast`` when given (each its own storage, as ``t.to(cast)`` makes it).

    ``decoder_input_ids = ids[:, :-1]`` is a view of ``ids``: autograd saves that one storage
    once, so capture must see one storage too.
    """
    bases: dict[int, torch.Tensor] = {}

    def fake(t: torch.Tensor) -> torch.Tensor:
        if cast is not None and t.is_floating_point():
            return torch.empty(t.shape, dtype=cast, device="cpu").requires_grad_(
                t.requires_grad)
        storage = t.untyped_storage()
        base = bases.setdefault(storage._cdata, torch.empty(storage.nbytes(), dtype=torch.uint8,
                                                            device="cpu"))
        view = torch.empty(0, dtype=t.dtype, device="cpu").set_(
            base.untyped_storage(), t.storage_offset(), t.shape, t.stride())
        return view.requires_grad_(t.requires_grad) if t.is_floating_point() or t.is_complex() \
            else view

    return pytree.tree_map_only(torch.Tensor, fake, (args, kwargs))


def _forward_error(err: Exception, where: str | None, modules: dict[str, nn.Module],
                   model: nn.Module, inputs: list[dict[str, Any]]) -> CaptureError:
    module = modules.get(where) if where else None
    place = (f"module {where!r} ({type(module).__name__})" if module is not None
             else f"{type(model).__name__}.forward")
    shown = ", ".join(f"{i['name']}: {i['dtype']}{i['shape']}" for i in inputs)
    expects = [f"{attr}={getattr(module, attr)!r} ({what})" for attr, what in _EXPECTS
               if module is not None and hasattr(module, attr)]
    hint = f"; {where!r} expects {', '.join(expects)}" if expects else ""
    if isinstance(err, (DataDependentOutputException, DynamicOutputShapeException)):
        hint += ("; capture runs on tensors without values (only integer and boolean inputs "
                 "on a real device, such as token ids and masks, keep theirs: "
                 "memflow.graph.eager), so code that reads the value of an activation or of a "
                 "float input (.item(), `if tensor:`, boolean indexing) cannot be captured")
    return CaptureError(f"the forward of {place} raised {type(err).__name__}: {err}. "
                        f"Example inputs: {shown}{hint}")


@contextlib.contextmanager
def _quiet_fake_kernels() -> Iterator[None]:
    # FakeTensorMode logs a traceback for every kernel that raises; capture re-raises the
    # error itself as a CaptureError naming the module, so the log is noise.
    log = logging.getLogger("torch._subclasses.fake_tensor")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


def _install_hooks(model: nn.Module, recorder: Recorder) -> list:
    handles = []
    for m in model.modules():
        handles.append(m.register_forward_pre_hook(recorder.pre_hook))
        handles.append(m.register_forward_hook(recorder.post_hook))
    return handles


def _default_loss(outputs: list[torch.Tensor]) -> torch.Tensor | None:
    grads = [t for t in outputs if t.requires_grad]
    if not grads:
        return None
    loss = grads[0].sum()
    for t in grads[1:]:
        loss = loss + t.sum()
    return loss


def from_torch(model: nn.Module, example_inputs: Any, *, units: Any = "leaves",
               backend: str | Backend = "cpu", autocast: Any = None,
               loss_fn: Callable[[Any], torch.Tensor] | None = None,
               name: str | None = None, keep_output: bool = False,
               expensive_ops: Iterable[str] = EXPENSIVE_OPS, bf16: bool = True,
               amp: bool = True) -> OpGraph:
    """Capture ``model`` on ``example_inputs`` as a graph of units for one training step.

    ``example_inputs`` is a tensor, a tuple/list of positional inputs or a dict of keyword
    inputs, on any device (``meta`` included). ``units`` picks the granularity (see
    :mod:`memflow.graph.units`); ``backend`` the device rules (:mod:`memflow.graph.backend`);
    ``autocast`` (``"float16"`` or ``"bfloat16"``) runs under autocast semantics.
    ``loss_fn(output) -> scalar`` adds a ``<loss>`` unit; without it backward starts from the
    sum of the outputs that require grad. The training step this graph stands for is the one
    people write, ``loss_fn(model(x)).backward()``: the model's output is dropped once the loss
    is computed, so it lives until its last forward reader (the loss) unless something saves
    it for backward. ``keep_output=True`` stands for a step that keeps a reference to the
    output through backward (``out = model(x); loss = loss_fn(out); loss.backward()`` with
    ``out`` still alive), as ``graph.meta["keep_output"]``. The model runs in its current
    mode (``train()`` for a training step). ``expensive_ops`` names the aten ops whose outputs selective
    recomputation keeps (:mod:`memflow.graph.selective`). Columns are described in
    ``docs/data-model.md``.

    With ``bf16`` (the default) a model whose parameters are float32, captured without
    autocast, runs a second time as a bf16 strategy runs it (:mod:`memflow.graph.compute`):
    ``graph.bf16`` holds the tensors and temporaries of that program, in the dtype each op
    makes (fp32 where the model upcasts), which the memory model charges under a bf16
    precision (:func:`memflow.sim.precision.activation_arrays`).

    With ``amp`` (the default) such a model runs once more as an ``amp`` strategy runs it:
    fp32 parameters and inputs, forward and loss under float16 autocast with the backend's op
    lists (``torch.autocast("cpu")`` for ``backend="cpu"``, CUDA's for a GPU backend,
    :mod:`memflow.graph.autocast`). ``graph.amp`` holds that program's tensors — the half
    copies autocast makes of the weights (once per step, its cache), fp16 outputs of its
    lower-precision ops, fp32 where it runs in fp32 — which the memory model charges under
    ``amp``.
    """
    if not isinstance(model, nn.Module):
        raise CaptureError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    rules = get_backend(backend)
    dtype = parse_autocast(autocast)
    args, kwargs = split_inputs(example_inputs)
    selected = select_units(model, units)
    paths = module_paths(model)
    modules = {p: m for m, p in paths.items()}
    inputs = describe_inputs(args, kwargs)
    batch = _batch_size(args, kwargs)
    expensive = frozenset(expensive_ops)
    counter = OpCounter()       # one for both passes: an uncounted op warns once

    def record(cast: torch.dtype | None = None, units: list[str] | None = None,
               autocast: torch.dtype | None = dtype) -> Recorder:
        recorder = Recorder(rules, counter, selected, paths, batch, expensive, units)
        _record(model, args, kwargs, recorder, rules, autocast, loss_fn, modules, inputs, cast)
        return recorder

    recorder = record()
    if not recorder.spans:
        raise CaptureError(f"the forward of {type(model).__name__} ran no op (it returns its "
                           "input unchanged, or only views of it): there is nothing to capture")
    meta = {"model": name or type(model).__name__, "batch_size": batch, "backend": rules.name,
            "autocast": None if dtype is None else str(dtype).replace("torch.", ""),
            "units": describe_units(units), "torch": torch.__version__, "inputs": inputs,
            "keep_output": bool(keep_output)}
    if expensive != EXPENSIVE_OPS:
        meta["expensive_ops"] = sorted(expensive)
    units_table = unit_table(recorder, modules)
    units_table["block"] = enclosing_blocks(model, units_table["module"])
    parameters = parameter_table(recorder, modules)
    passes = {}
    if dtype is None and _all_fp32(model):
        first = (recorder, units_table, parameters, modules, meta)
        if bf16:
            passes["bf16"] = _second_pass(
                lambda names: record(COMPUTE_DTYPE, names), *first,
                how="with its parameters and inputs in bfloat16",
                fallback="bf16 precisions will halve its fp32 activations instead")
        if amp:
            passes["amp"] = _second_pass(
                lambda names: record(None, names, AMP_DTYPE), *first,
                how="under float16 autocast",
                fallback="amp keeps its fp32 sizes, and export refuses amp on it")
    return OpGraph(units_table, tensor_table(recorder), meta, parameters=parameters, **passes)


def _second_pass(record: Callable, first: Recorder, units: pd.DataFrame,
                 parameters: pd.DataFrame, modules: dict[str, nn.Module],
                 meta: dict, *, how: str, fallback: str) -> OpGraph | None:
    """``graph.bf16`` or ``graph.amp``: the step as ``record(names)`` runs it; None with a
    warning where the model does not run so (it mixes a dtype of its own with bf16) or runs
    other units than in the first pass."""
    names = [s.name for s in first.spans]
    try:
        second = record(names)
    except CaptureError as err:
        warnings.warn(f"{meta['model']} does not run {how} ({err}); {fallback}", stacklevel=3)
        return None
    if [s.name for s in second.spans] != names:
        warnings.warn(f"{meta['model']} ran other units {how} than in float32; {fallback}",
                      stacklevel=3)
        return None
    return pass_graph(units, parameters, second, modules, meta)


def _all_fp32(model: nn.Module) -> bool:
    """Whether the model's floating parameters are all float32 (what the bf16 pass casts)."""
    floating = [p for p in model.parameters() if p.is_floating_point()]
    return bool(floating) and all(p.dtype == torch.float32 for p in floating)


def _record(model: nn.Module, args: tuple, kwargs: dict, recorder: Recorder, rules: Backend,
            dtype: torch.dtype | None, loss_fn: Callable | None,
            modules: dict[str, nn.Module], inputs: list, cast: torch.dtype | None) -> None:
    """Run one training step on fake tensors under ``recorder``; with ``cast``, as a bf16
    strategy runs it (:mod:`memflow.graph.compute`): parameters, floating inputs and batch
    norms' statistics in ``cast``, the loss on outputs upcast to float32."""
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    values = KnownValues()
    statistics = cast_buffer_names(model) if cast is not None else set()
    with fake_mode:
        fake_args, fake_kwargs = _fake_inputs(args, kwargs, cast)
        state = {}
        aliases = _aliases(model)
        for is_buffer, named in ((False, model.named_parameters()), (True, model.named_buffers())):
            for pname, t in named:
                to = cast if (not is_buffer or statistics & set(aliases[id(t)])) else None
                state[pname] = _fake_like(t, to)
                recorder.add_weight(state[pname], aliases[id(t)], is_buffer)
                if is_buffer:
                    _add_value(values, state[pname], t)
                elif state[pname].requires_grad:
                    state[pname].register_post_accumulate_grad_hook(recorder.parameter_gradient)
    fakes = pytree.tree_leaves((fake_args, fake_kwargs))
    for real, t in zip(pytree.tree_leaves((args, kwargs)), fakes):
        if isinstance(t, torch.Tensor):
            recorder.add_input(t)
            _add_value(values, t, real)
    handles = _install_hooks(model, recorder)
    try:
        with fake_mode, values, recorder, eager_predicates(values), _quiet_fake_kernels():
            loss = _forward(model, state, fake_args, fake_kwargs, recorder, rules, dtype,
                            loss_fn, modules, inputs, cast is not None)
            values.computing = False        # backward is autograd's code: it reads no value
            if loss is not None:
                recorder.phase = "backward"
                try:
                    loss.backward()
                    recorder.finish_backward()
                except Exception as err:  # a backward formula fake tensors cannot run
                    recorder.estimate_backward(err)
            recorder.phase = None
    finally:
        for h in handles:
            h.remove()


def _add_value(values: KnownValues, fake: torch.Tensor, real: torch.Tensor) -> None:
    # Token ids, masks and positions decide branches; float data (images, weights) never
    # does here, and computing from it would run the model for real.
    if not (real.is_floating_point() or real.is_complex()):
        values.add(fake, real.detach().clone())


def _aliases(model: nn.Module) -> dict[int, list[str]]:
    """Every name of each parameter and buffer (a tied weight has several), keyed by ``id``."""
    names: dict[int, list[str]] = {}
    for pname, t in (*model.named_parameters(remove_duplicate=False),
                     *model.named_buffers(remove_duplicate=False)):
        names.setdefault(id(t), []).append(pname)
    return names


def _forward(model: nn.Module, state: dict, args: tuple, kwargs: dict, recorder: Recorder,
             rules: Backend, dtype: torch.dtype | None, loss_fn: Callable | None,
             modules: dict[str, nn.Module], inputs: list,
             wide_loss: bool = False) -> torch.Tensor | None:
    """Run the recorded forward (and loss); returns the scalar to run backward from. With
    ``wide_loss`` the loss reads the outputs upcast to float32."""
    with torch.autograd.graph.saved_tensors_hooks(recorder.pack, lambda t: t), \
            rules.context(dtype):
        recorder.phase = "forward"
        try:
            out = functional_call(model, state, args, kwargs, strict=False, tie_weights=True)
        except Exception as err:
            raise _forward_error(err, recorder.innermost, modules, model, inputs) from err
        outputs = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        recorder.mark_outputs(outputs)
        if loss_fn is None:
            recorder.finish_forward()
            recorder.phase = None
            return _default_loss(upcast(outputs) if wide_loss else outputs)
        recorder.begin_loss()
        try:
            loss = loss_fn(upcast(out) if wide_loss else out)
        except Exception as err:
            raise CaptureError(f"loss_fn raised {type(err).__name__}: {err}; it is called as "
                               "loss_fn(output) with the model's output") from err
        finally:
            recorder.end_loss()
        if not (isinstance(loss, torch.Tensor) and loss.numel() == 1):
            raise CaptureError(f"loss_fn must return a scalar tensor; it returned "
                               f"{type(loss).__name__}"
                               f"{list(loss.shape) if isinstance(loss, torch.Tensor) else ''}")
        recorder.finish_forward()
        recorder.phase = None
        return loss if loss.requires_grad else None
