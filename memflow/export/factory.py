"""A model and its example inputs from a zoo name or from ``path/to/file.py:factory``.

The one place that loads a user's factory: the ``memflow`` command captures it, export checks a
strategy against it and the exported training script builds it, all by these functions. The
factory contract (:data:`FACTORY_CONTRACT`, also in ``memflow search --help``): a function
returning ``(model, example_inputs)`` like :func:`memflow.zoo.get`, called with the options as
keywords and with ``batch_size=`` when it takes that keyword. A factory without one makes its
own batch, so asking it for another batch is an error rather than a batch silently ignored.

>>> model, (x,) = build_model("chain", 4, {"n": 2, "width": 8})
>>> tuple(x.shape), x.device.type
((4, 8), 'meta')
"""
from __future__ import annotations

import contextlib
import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Any, Callable, Mapping

import torch
from torch import nn

from ..errors import MemflowError

__all__ = ["FACTORY_CONTRACT", "is_file_model", "load_callable", "takes_batch_size",
           "call_factory", "build_model"]

FACTORY_CONTRACT = (
    "A model file: --model path/to/model.py:make names a function make(batch_size=..., "
    "**options) that returns (model, example_inputs) like memflow.zoo.get: an nn.Module and "
    "a tensor, a tuple of positional inputs or a dict of keyword inputs, batch first. "
    "--option KEY=VALUE passes keywords to it; --batch is passed as batch_size=, so a "
    "factory without that keyword cannot be given --batch (leave --batch out to use the "
    "batch its inputs have). A factory may instead return a bare model, whose inputs are "
    "then a random batch of --input-shape (one sample's shape).")
"""What a ``file.py:factory`` must be, worded for ``--help``."""


def is_file_model(spec: str) -> bool:
    """Whether ``spec`` names a factory in a Python file rather than a zoo model.

    >>> is_file_model("path/to/model.py:make"), is_file_model("resnet50")
    (True, False)
    """
    return ".py:" in spec


def load_callable(spec: str) -> Callable:
    """The function ``name`` of ``path/to/file.py:name`` (the file may import its neighbours).

    >>> load_callable("no/such.py:make")
    Traceback (most recent call last):
    ...
    memflow.errors.MemflowError: model 'no/such.py:make': no file 'no/such.py'
    """
    file, _, name = spec.rpartition(":")
    path = Path(file)
    if not path.is_file():
        raise MemflowError(f"model {spec!r}: no file {file!r}")
    module_spec = importlib.util.spec_from_file_location(f"_memflow_model_{path.stem}", path)
    module = importlib.util.module_from_spec(module_spec)
    folder = str(path.resolve().parent)
    sys.path.insert(0, folder)
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:  # the user's file: any error it raises is theirs to fix
        raise MemflowError(f"model {spec!r}: importing {file} failed: "
                           f"{type(exc).__name__}: {exc}") from None
    finally:
        sys.path.remove(folder)
    found = getattr(module, name, None)
    if not callable(found):
        names = sorted(k for k, v in vars(module).items()
                       if callable(v) and not k.startswith("_") and
                       getattr(v, "__module__", None) == module.__name__)
        raise MemflowError(f"model {spec!r}: {file} has no function {name!r}; "
                           f"functions there: {', '.join(names) or 'none'}")
    return found


def takes_batch_size(factory: Callable) -> bool:
    """Whether ``factory`` accepts a ``batch_size`` keyword (by name or ``**kwargs``).

    >>> takes_batch_size(lambda batch_size=8: None), takes_batch_size(lambda: None)
    (True, False)
    """
    params = inspect.signature(factory).parameters.values()
    return any(p.name == "batch_size" or p.kind is p.VAR_KEYWORD for p in params)


def call_factory(spec: str, batch_size: int | None = None,
                 options: Mapping[str, Any] | None = None, *,
                 device: str | None = None) -> tuple[nn.Module, Any]:
    """``(model, example_inputs)`` from the factory ``spec``, or ``(model, None)`` for a
    factory returning a bare model; tensors made by default on ``device`` when given.

    ``batch_size`` (None: the factory's own) goes to the factory's ``batch_size`` keyword; a
    factory returning inputs without taking that keyword is refused when a batch is asked for.
    """
    factory = load_callable(spec)
    kwargs = dict(options or {})
    takes_batch = takes_batch_size(factory)
    if takes_batch and batch_size is not None:
        kwargs["batch_size"] = batch_size
    try:
        with torch.device(device) if device else contextlib.nullcontext():
            made = factory(**kwargs)
    except Exception as exc:  # the user's factory
        raise MemflowError(f"model {spec!r}: the factory raised {type(exc).__name__}: "
                           f"{exc}") from None
    if isinstance(made, nn.Module):
        return made.train(), None
    if not (isinstance(made, (tuple, list)) and len(made) == 2 and isinstance(made[0], nn.Module)):
        raise MemflowError(f"model {spec!r}: the factory must return (model, example_inputs) "
                           f"or an nn.Module, got {type(made).__name__}")
    if batch_size is not None and not takes_batch:
        raise MemflowError(f"model {spec!r}: {getattr(factory, '__name__', 'the factory')}() "
                           f"takes no batch_size keyword, so batch {batch_size} would be "
                           "ignored; add a batch_size keyword to it, or leave the batch out to "
                           "use the batch of the inputs it returns")
    return made[0].train(), made[1]


def build_model(spec: str, batch_size: int | None = None,
                options: Mapping[str, Any] | None = None, *, device: str = "meta",
                seed: int = 0) -> tuple[nn.Module, Any]:
    """``(model, example_inputs)`` of a zoo name or a factory; the zoo builds on ``device``
    (weights from ``seed`` on a real one), a factory on its own devices after
    ``torch.manual_seed(seed)``. ``batch_size`` None is the model's own."""
    options = dict(options or {})
    if not is_file_model(spec):
        from .. import zoo
        return zoo.get(spec, batch_size, device=device, seed=seed, **options)
    torch.manual_seed(seed)
    model, inputs = call_factory(spec, batch_size, options)
    if inputs is None:
        raise MemflowError(f"model {spec!r}: the factory returned a model without inputs; "
                           "a training script needs (model, example_inputs) from it")
    return model, inputs
