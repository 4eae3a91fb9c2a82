"""How a zoo model is described: its builder, its example inputs, and where it comes from.

Each family module (``vision``, ``resnet``, ``inception``, ``transformer``, ``rnn``, ``basic``)
lists its models as :class:`ModelSpec` objects in a module-level ``SPECS`` tuple;
:mod:`memflow.zoo` collects them. A spec splits its options in two: ``arch`` knobs are passed
to the model's constructor, ``data`` knobs (image size, sequence length) to its input maker,
which also reads the built model (vocabulary size, input width) so the two always agree.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch
from torch import nn

from ..errors import MemflowError

__all__ = ["ModelSpec", "image_inputs", "token_inputs"]

InputMaker = Callable[..., tuple[torch.Tensor, ...]]


@dataclass(frozen=True)
class ModelSpec:
    """One zoo entry.

    ``build(**arch)`` returns the model; ``inputs(model, batch_size, **data)`` returns the
    example inputs, created on the current default device (the zoo sets it).
    """

    name: str
    family: str
    build: Callable[..., nn.Module]
    inputs: InputMaker
    arch: Mapping[str, Any]
    data: Mapping[str, Any]
    batch_size: int
    input: str
    output: str
    source: str

    def options(self, overrides: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """``(arch, data)`` with ``overrides`` applied; an unknown key is a MemflowError.

        >>> from memflow.zoo import spec_of
        >>> spec_of("gpt2").options({"n_layer": 2})[0]["n_layer"]
        2
        """
        unknown = sorted(set(overrides) - set(self.arch) - set(self.data))
        if unknown:
            raise MemflowError(
                f"zoo model {self.name!r} has no option {', '.join(map(repr, unknown))}; "
                f"valid options: {', '.join(sorted({**self.arch, **self.data}))}")
        arch = {k: overrides.get(k, v) for k, v in self.arch.items()}
        data = {k: overrides.get(k, v) for k, v in self.data.items()}
        return arch, data


def image_inputs(model: nn.Module, batch_size: int, image_size: int) -> tuple[torch.Tensor]:
    """One batch of RGB images, ``(batch, 3, image_size, image_size)`` float.

    >>> image_inputs(nn.Identity(), 2, 32)[0].shape
    torch.Size([2, 3, 32, 32])
    """
    return (torch.randn(batch_size, 3, image_size, image_size),)


def token_inputs(model: nn.Module, batch_size: int, seq_len: int) -> tuple[torch.Tensor]:
    """One batch of token ids, ``(batch, seq_len)`` int64 below ``model.vocab``.

    >>> model = nn.Module()
    >>> model.vocab = 10
    >>> ids, = token_inputs(model, 2, 5)
    >>> ids.shape, bool(ids.max() < 10)
    (torch.Size([2, 5]), True)
    """
    # A learned position table has a fixed length; a longer sequence would index past it.
    limit = getattr(model, "max_positions", None)
    if limit is not None and seq_len > limit:
        raise MemflowError(f"seq_len={seq_len} is longer than the model's max_positions={limit}; "
                           f"use seq_len <= {limit} or raise max_positions")
    return (torch.randint(0, model.vocab, (batch_size, seq_len)),)
