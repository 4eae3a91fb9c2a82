"""Which values a traced model sends between its stages carry a gradient, and detaching those
that do not where a stage receives them.

A stage built by ``torch.distributed.pipelining`` makes every floating value it receives from
another stage require grad (``PipelineStage`` creates its receive buffers so), and a sample
group's receive does the same (:mod:`memflow.export.sample_groups`). A value the model computes
without grad — Llama's rotary ``cos`` and ``sin``, made from a buffer and the positions — then
enters the receiving stage's autograd graph: every product with it saves its other operand as
well (q, k and their rotated halves, 288 floats per sample and layer of the zoo Llama that
``benchmarks/bench_ranks.py`` runs: +11% to +16% held for backward on those ranks), and a
gradient nobody uses is sent back. The model on one process saves none of it, and neither does
the memory model. So a stage detaches, on entry, each value it receives that the model computes
without grad (:func:`detach_constants`), as the trace tells (:func:`constant_inputs`).

The trace tells it conservatively: a value may carry a gradient when any value or trainable
parameter it is computed from may (every op is taken as differentiable); only what is
computed from buffers, constants and other such values is detached, so a gradient the model
has is never cut. The model's own inputs are left as the caller gives them.

>>> import torch
>>> from torch import nn
>>> from torch.distributed.pipelining import SplitPoint, pipeline
>>> class Head(nn.Module):
...     def __init__(self):
...         super().__init__()
...         self.proj = nn.Linear(4, 4)
...     def forward(self, h, scale):
...         return self.proj(h) * scale
>>> class Model(nn.Module):
...     def __init__(self):
...         super().__init__()
...         self.body, self.head = nn.Linear(4, 4), Head()
...         self.register_buffer("scale", torch.ones(4))
...     def forward(self, x):
...         return self.head(self.body(x), self.scale * 2)
>>> pipe = pipeline(Model(), (torch.ones(2, 4),), split_spec={"head": SplitPoint.BEGINNING})
>>> constant_inputs(pipe)           # stage 1 receives body(x), with grad, and scale * 2
{0: [], 1: [1]}
"""
from __future__ import annotations

import operator
from typing import Any

import torch
from torch import nn
from torch.fx.node import Node, map_arg
from torch.utils import _pytree as pytree

__all__ = ["constant_inputs", "detach_constants"]


def _any(flags: dict[Node, Any], arg: Any) -> bool:
    """Whether any value ``arg`` reads (a node, or a structure of them) may carry a gradient."""
    found: list[Any] = []
    map_arg(arg, found.append)
    return any(pytree.tree_leaves([flags[n] for n in found]))


def _attribute(module: nn.Module, target: str) -> Any:
    value: Any = module
    for name in target.split("."):
        value = getattr(value, name, None)
    return value


def _outputs(module: nn.Module, inputs: list[bool]) -> Any:
    """Per output of ``module``'s traced graph (in its structure), whether it may carry a
    gradient when its inputs do as ``inputs`` says; ``True`` for a module that is no graph."""
    graph = getattr(module, "graph", None)
    if not isinstance(graph, torch.fx.Graph):
        return True
    flags: dict[Node, Any] = {}
    given = iter(inputs)
    for node in graph.nodes:
        if node.op == "placeholder":
            flags[node] = next(given, True)
        elif node.op == "get_attr":
            value = _attribute(module, str(node.target))
            flags[node] = not isinstance(value, torch.Tensor) or value.requires_grad
        elif node.op == "call_module":
            sub = module.get_submodule(str(node.target))
            flags[node] = (_outputs(sub, [_any(flags, a) for a in node.args]) if not node.kwargs
                           else _any(flags, (node.args, node.kwargs)))
        elif (node.op == "call_function" and node.target is operator.getitem
              and isinstance(flags[node.args[0]], (list, tuple))):
            flags[node] = flags[node.args[0]][node.args[1]]
        elif node.op == "output":
            return map_arg(node.args[0], flags.__getitem__)
        else:
            flags[node] = _any(flags, (node.args, node.kwargs))
    return True


def constant_inputs(pipe) -> dict[int, list[int]]:
    """Per stage of the traced ``pipe`` (a ``torch.distributed.pipelining`` ``Pipe``), the
    positions of its inputs that come from another stage and carry no gradient in the model."""
    flags: dict[Node, Any] = {}
    out: dict[int, list[int]] = {}
    for node in pipe.split_gm.graph.nodes:
        if node.op == "placeholder":        # the model's inputs, as the caller gives them
            flags[node] = True
        elif node.op == "call_module":
            given = [_any(flags, a) for a in node.args]
            out[int(str(node.target).rsplit("_", 1)[1])] = [
                i for i, g in enumerate(given) if not g]
            flags[node] = _outputs(pipe.split_gm.get_submodule(str(node.target)), given)
        elif node.op == "call_function" and node.target is operator.getitem and isinstance(
                flags[node.args[0]], (list, tuple)):
            flags[node] = flags[node.args[0]][node.args[1]]
        elif node.op != "output":
            flags[node] = _any(flags, (node.args, node.kwargs))
    return out


def detach_constants(stage: torch.fx.GraphModule, positions: list[int]) -> None:
    """Make the traced ``stage`` detach its inputs at ``positions`` on entry (in place).

    >>> stage = torch.fx.symbolic_trace(lambda x, scale: x * scale)
    >>> detach_constants(stage, [1])
    >>> x, scale = torch.ones(2, requires_grad=True), torch.ones(2, requires_grad=True)
    >>> stage(x, scale).sum().backward()
    >>> x.grad is None, scale.grad is None
    (False, True)
    """
    graph = stage.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    for i in positions:
        received = placeholders[i]
        with graph.inserting_after(placeholders[-1]):
            detached = graph.call_method("detach", (received,))
        received.replace_all_uses_with(detached, delete_user_cb=lambda user: user is not detached)
    if positions:
        stage.recompile()
