"""The model zoo: published architectures in plain PyTorch, with example inputs.

Every model reproduces its published architecture and parameter count (see :func:`info` and
each family module: :mod:`~memflow.zoo.vision`, :mod:`~memflow.zoo.resnet`,
:mod:`~memflow.zoo.inception`, :mod:`~memflow.zoo.transformer`, :mod:`~memflow.zoo.llama`,
:mod:`~memflow.zoo.rnn`, :mod:`~memflow.zoo.basic`). Nothing is downloaded and torchvision is not needed.

* :func:`names` lists the models; :func:`info` describes them (family, parameters, default
  batch, inputs, outputs, source).
* :func:`get` builds a model and a batch of example inputs. On ``device="meta"`` (the default)
  nothing is allocated, so even gpt2-xl, BigLSTM or llama2-70b build instantly; on ``"cpu"`` the weights
  and inputs are drawn from ``seed``, so two calls give the same tensors. Keyword options
  override architecture knobs (``n_layer``, ``hidden``, ``vocab``, ``width``...) and input
  sizes (``seq_len``, ``image_size``...) to shrink big models for tests.
* :func:`graph` captures the model into an :class:`~memflow.graph.OpGraph`.

Models are returned in training mode, in the default dtype (float32).

>>> from memflow import zoo
>>> zoo.names()[:4]
['alexnet', 'vgg16', 'vgg19', 'resnet50']
>>> model, (ids,) = zoo.get("gpt2", batch_size=2, seq_len=128)
>>> ids.shape, ids.device.type
(torch.Size([2, 128]), 'meta')
>>> model(ids).shape
torch.Size([2, 128, 50257])
>>> model, inputs = zoo.get("gpt2", batch_size=2, device="cpu", seed=1,
...                         n_layer=2, hidden=64, n_head=4, vocab=100, seq_len=8)
>>> model(*inputs).dtype, model.training
(torch.float32, True)
"""
from __future__ import annotations

import functools
import operator
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch
from torch import nn

from ..errors import MemflowError
from . import basic, inception, llama, resnet, rnn, transformer, vision
from .spec import ModelSpec

if TYPE_CHECKING:  # pragma: no cover - for type checkers only
    from ..graph import OpGraph

__all__ = ["names", "get", "graph", "info", "spec_of", "ModelSpec"]

_SPECS: dict[str, ModelSpec] = {
    spec.name: spec
    for family in (vision, resnet, inception, transformer, llama, rnn, basic)
    for spec in family.SPECS
}


def names() -> list[str]:
    """The zoo's model names, grouped by family.

    >>> "gpt2-xl" in names() and "chain" in names()
    True
    """
    return list(_SPECS)


def spec_of(name: str) -> ModelSpec:
    """The :class:`~memflow.zoo.spec.ModelSpec` of ``name``; unknown names list the valid ones.

    >>> spec_of("resnet50").arch["blocks"]
    (3, 4, 6, 3)
    """
    try:
        return _SPECS[name]
    except (KeyError, TypeError):
        raise MemflowError(f"unknown zoo model {name!r}; valid: {', '.join(_SPECS)}") from None


def _positive_int(value: Any) -> int | None:
    # Accept numpy integers (a batch size read from info()), not bools or floats.
    if isinstance(value, bool):
        return None
    try:
        value = operator.index(value)
    except TypeError:
        return None
    return value if value >= 1 else None


def get(name: str, batch_size: int | None = None, device: str | torch.device = "meta", *,
        seed: int = 0, **cfg: Any) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Build zoo model ``name`` and a batch of example inputs on ``device``.

    ``batch_size`` defaults to the model's (see :func:`info`). ``cfg`` overrides options of
    the model (``spec_of(name).arch``) or of its inputs (``spec_of(name).data``); an unknown
    option is a :class:`~memflow.errors.MemflowError` listing the valid ones. On a real device
    the weights and inputs come from ``torch.manual_seed(seed)``; the global random state is
    left as it was.

    >>> model, (x,) = get("resnet50", batch_size=4)
    >>> x.shape, next(model.parameters()).device.type
    (torch.Size([4, 3, 224, 224]), 'meta')
    >>> model, (x,) = get("chain", device="cpu", n=3, width=8, batch_size=2)
    >>> model(x).shape
    torch.Size([2, 8])
    """
    spec = spec_of(name)
    arch, data = spec.options(cfg)
    batch = _positive_int(spec.batch_size if batch_size is None else batch_size)
    if batch is None:
        raise MemflowError(f"zoo model {name!r}: batch_size={batch_size!r} must be a positive "
                           "integer")
    try:
        target = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise MemflowError(f"zoo model {name!r}: device={device!r} is not a torch device "
                           f"(e.g. 'meta', 'cpu', 'cuda')") from err
    # Fork the generator that init draws from, so the caller's random stream is untouched.
    rng_devices = [target] if target.type == "cuda" else []
    with torch.random.fork_rng(devices=rng_devices), target:
        torch.manual_seed(seed)
        model = spec.build(**arch)
        inputs = spec.inputs(model, batch, **data)
    return model.train(), inputs


def graph(name: str, batch_size: int | None = None, *, units: Any = None,
          backend: Any = None, autocast: Any = None, loss_fn: Any = None,
          **cfg: Any) -> "OpGraph":
    """Capture zoo model ``name`` on meta tensors with :func:`memflow.from_torch`.

    ``units``, ``backend``, ``autocast`` and ``loss_fn`` are passed to capture when given
    (capture's defaults otherwise); ``cfg`` is as for :func:`get`. The graph's
    ``meta["model"]`` is the zoo name.

    >>> g = graph("chain", batch_size=4, n=3, width=16, units="blocks")
    >>> g.names, g.meta["model"]
    (['layers.0', 'layers.1', 'layers.2'], 'chain')
    """
    from ..graph.capture import from_torch  # capture is heavier; load it only when used

    model, inputs = get(name, batch_size, **cfg)
    options = {"units": units, "backend": backend, "autocast": autocast, "loss_fn": loss_fn}
    return from_torch(model, inputs, name=name,
                      **{k: v for k, v in options.items() if v is not None})


def info() -> pd.DataFrame:
    """One row per model, indexed by name: family, parameters (counted on meta, tied weights
    once), default batch size, inputs, outputs and source.

    >>> table = info()
    >>> int(table.loc["resnet50", "params"])
    25557032
    >>> list(table.columns)
    ['family', 'params', 'batch_size', 'inputs', 'outputs', 'source']
    """
    return _info().copy()


@functools.cache
def _info() -> pd.DataFrame:
    # Building every model, even on meta, takes a second; the zoo never changes in a process.
    rows = []
    for name, spec in _SPECS.items():
        model, _ = get(name, batch_size=1)
        rows.append({"name": name, "family": spec.family,
                     "params": sum(p.numel() for p in model.parameters()),
                     "batch_size": spec.batch_size, "inputs": spec.input,
                     "outputs": spec.output, "source": spec.source})
    return pd.DataFrame(rows).set_index("name")
