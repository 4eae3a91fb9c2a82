"""What the command line is given, turned into memflow objects: model, graph, cluster, strategy.

A model is a :mod:`memflow.zoo` name (``resnet50``; ``--option n_layer=2`` overrides its
knobs) or ``path/to/file.py:factory``. The factory is called with ``batch_size=`` when it takes
that keyword (and with the ``--option`` keywords) and returns ``(model, example_inputs)`` as
:func:`memflow.zoo.get` does, or a bare model, whose inputs are then a random batch of
``--input-shape`` (one sample's shape, the batch is put in front).

>>> parse_options(["n=3", "width=16", "act=relu"])
{'n': 3, 'width': 16, 'act': 'relu'}
>>> parse_units("blocks"), parse_units("2")
('blocks', 2)
>>> parse_shape("3,32,32")
(3, 32, 32)
>>> load_cluster("2xV100-16GB", "1GB").devices["memory_bytes"].tolist()
[1000000000.0, 1000000000.0]
"""
from __future__ import annotations

import ast
import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from torch import nn

from ..errors import MemflowError

__all__ = ["parse_options", "parse_units", "parse_shape", "load_model", "load_graph",
           "load_cluster", "load_strategy", "is_file_model"]


def parse_options(items: Sequence[str] | None) -> dict[str, Any]:
    """``["key=value", ...]`` as a dict; values are Python literals where they parse as one."""
    out: dict[str, Any] = {}
    for item in items or ():
        key, sep, text = str(item).partition("=")
        if not sep or not key.strip():
            raise MemflowError(f"--option {item!r} must look like KEY=VALUE (e.g. n_layer=2)")
        try:
            value: Any = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = text
        out[key.strip()] = value
    return out


def parse_units(text: str) -> str | int:
    """``blocks``, ``leaves`` or a module depth (an integer)."""
    if text in ("blocks", "leaves"):
        return text
    try:
        return int(text)
    except ValueError:
        raise MemflowError(f"--units {text!r}: valid are 'blocks', 'leaves' or a module depth "
                           "(an integer)") from None


def parse_shape(text: str) -> tuple[int, ...]:
    """``"3,224,224"`` as a shape (one sample's: the batch goes in front)."""
    try:
        shape = tuple(int(p) for p in text.replace("x", ",").split(",") if p.strip())
    except ValueError:
        shape = ()
    if not shape or min(shape) < 1:
        raise MemflowError(f"--input-shape {text!r}: give one sample's shape as positive "
                           "integers, e.g. 3,224,224")
    return shape


def is_file_model(spec: str) -> bool:
    """Whether ``spec`` names a factory in a Python file rather than a zoo model."""
    return ".py:" in spec


def _factory(spec: str):
    file, _, name = spec.rpartition(":")
    path = Path(file)
    if not path.is_file():
        raise MemflowError(f"--model {spec!r}: no file {file!r}")
    module_spec = importlib.util.spec_from_file_location(f"_memflow_model_{path.stem}", path)
    module = importlib.util.module_from_spec(module_spec)
    sys.path.insert(0, str(path.resolve().parent))   # so the file can import its neighbours
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:  # the user's file: any error it raises is theirs to fix
        raise MemflowError(f"--model {spec!r}: importing {file} failed: "
                           f"{type(exc).__name__}: {exc}") from None
    finally:
        sys.path.remove(str(path.resolve().parent))
    factory = getattr(module, name, None)
    if not callable(factory):
        found = sorted(k for k, v in vars(module).items()
                       if callable(v) and not k.startswith("_") and
                       getattr(v, "__module__", None) == module.__name__)
        raise MemflowError(f"--model {spec!r}: {file} has no function {name!r}; "
                           f"functions there: {', '.join(found) or 'none'}")
    return factory


def load_model(spec: str, batch_size: int, *, options: Mapping[str, Any] | None = None,
               input_shape: Sequence[int] | None = None) -> tuple[nn.Module, Any]:
    """``(model, example_inputs)`` on meta tensors for a zoo name, or from a file's factory.

    >>> model, (x,) = load_model("chain", 4, options={"n": 2, "width": 8})
    >>> tuple(x.shape), x.device.type
    ((4, 8), 'meta')
    """
    options = dict(options or {})
    if not is_file_model(spec):
        from .. import zoo
        if input_shape is not None:
            raise MemflowError(f"--input-shape is for models from a file; zoo model {spec!r} "
                               "has its own inputs (change them with --option, e.g. seq_len=64)")
        return zoo.get(spec, batch_size, **options)
    factory = _factory(spec)
    kwargs = dict(options)
    if "batch_size" in inspect.signature(factory).parameters:
        kwargs["batch_size"] = batch_size
    try:
        made = factory(**kwargs)
    except Exception as exc:  # the user's factory
        raise MemflowError(f"--model {spec!r}: the factory raised {type(exc).__name__}: "
                           f"{exc}") from None
    if isinstance(made, nn.Module):
        if input_shape is None:
            raise MemflowError(f"--model {spec!r} returned a model without inputs: give "
                               "--input-shape (one sample's, e.g. 3,224,224) or return "
                               "(model, example_inputs)")
        return made.train(), torch.randn(batch_size, *input_shape, device="meta")
    if (isinstance(made, (tuple, list)) and len(made) == 2 and isinstance(made[0], nn.Module)):
        return made[0].train(), made[1]
    raise MemflowError(f"--model {spec!r}: the factory must return (model, example_inputs) or "
                       f"an nn.Module, got {type(made).__name__}")


def load_graph(spec: str, batch_size: int, *, units: str | int = "blocks",
               options: Mapping[str, Any] | None = None,
               input_shape: Sequence[int] | None = None):
    """Capture the model :func:`load_model` gives into an :class:`~memflow.OpGraph`."""
    from ..graph.capture import from_torch

    if not isinstance(batch_size, int) or batch_size < 1:
        raise MemflowError(f"--batch {batch_size!r} must be a positive integer")
    model, inputs = load_model(spec, batch_size, options=options, input_shape=input_shape)
    name = Path(spec.rpartition(":")[0]).stem if is_file_model(spec) else spec
    return from_torch(model, inputs, units=units, name=name)


def load_cluster(preset: str, memory_limit: str | None = None):
    """The cluster a preset names, each device's memory capped at ``memory_limit``.

    The cap is the cluster's memory, not a separate number, so the search, the simulation and
    the report all see the same capacity lines.
    """
    from ..hardware import Cluster, memory_limits

    cluster = Cluster.preset(preset)
    if memory_limit is None:
        return cluster
    limits = memory_limits(cluster, memory_limit)
    capped = cluster.with_memory(dict(zip(cluster.devices.index, limits.tolist())))
    capped.name = f"{cluster.name} (≤ {memory_limit} per GPU)"
    return capped


def load_strategy(path: str | Path, graph=None, cluster=None):
    """A strategy from its JSON file, checked against ``graph`` and ``cluster`` when given."""
    from ..strategy import Strategy

    strategy = Strategy.from_json(Path(path))
    return strategy.validate(graph, cluster) if graph is not None else strategy
