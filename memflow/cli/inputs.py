"""What the command line is given, turned into memflow objects: model, graph, cluster, strategy.

A model is a :mod:`memflow.zoo` name (``resnet50``; ``--option n_layer=2`` overrides its
knobs) or ``path/to/file.py:factory``, loaded by :mod:`memflow.export.factory` (the contract
is its ``FACTORY_CONTRACT``: ``(model, example_inputs)``, ``batch_size=`` when it takes that
keyword), or a bare model, whose inputs are then a random batch of ``--input-shape`` (one
sample's shape, the batch is put in front). Without ``--batch`` the batch is the model's own:
the zoo's (``memflow zoo``) or that of the inputs the factory returns.

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
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from torch import nn

from ..errors import MemflowError
from ..export.factory import call_factory, is_file_model

__all__ = ["parse_options", "parse_units", "parse_shape", "load_model", "load_graph",
           "load_cluster", "load_strategy"]


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


def load_model(spec: str, batch_size: int | None, *, options: Mapping[str, Any] | None = None,
               input_shape: Sequence[int] | None = None) -> tuple[nn.Module, Any]:
    """``(model, example_inputs)`` on meta tensors for a zoo name, or from a file's factory
    (:mod:`memflow.export.factory`); ``batch_size`` None is the model's own.

    >>> model, (x,) = load_model("chain", 4, options={"n": 2, "width": 8})
    >>> tuple(x.shape), x.device.type
    ((4, 8), 'meta')
    """
    if not is_file_model(spec):
        from .. import zoo
        if input_shape is not None:
            raise MemflowError(f"--input-shape is for models from a file; zoo model {spec!r} "
                               "has its own inputs (change them with --option, e.g. seq_len=64)")
        return zoo.get(spec, batch_size, **dict(options or {}))
    model, inputs = call_factory(spec, batch_size, options)
    if inputs is not None:
        return model, inputs
    if input_shape is None or batch_size is None:
        raise MemflowError(f"--model {spec!r} returned a model without inputs: give "
                           "--input-shape (one sample's, e.g. 3,224,224) and --batch, or "
                           "return (model, example_inputs)")
    return model, torch.randn(batch_size, *input_shape, device="meta")


def load_graph(spec: str, batch_size: int | None, *, units: str | int = "blocks",
               options: Mapping[str, Any] | None = None,
               input_shape: Sequence[int] | None = None):
    """Capture the model :func:`load_model` gives into an :class:`~memflow.OpGraph` (its
    ``meta["batch_size"]`` is the batch, the model's own when ``batch_size`` is None)."""
    from ..graph.capture import from_torch

    if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
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
