"""Per-unit data-parallel degrees across processes: FlexFlow's per-unit "sample" split.

A strategy may give its units different sample degrees — convolutions over 4 devices, the
classifier over 1. Consecutive units with the same degree and devices form a *group*
(:func:`~memflow.strategy.runnable.sample_groups`); the rule for what runs is
:func:`~memflow.strategy.runnable.sample_problem`. Each process is one device of the strategy
(:func:`group_ranks`); group ``k`` of degree ``d`` runs on the ranks of its ``d`` devices, the
``j``-th of them on the ``j``-th share of the global batch.

The model is cut between groups by ``torch.distributed.pipelining``'s tracer, as pipeline
stages are (:func:`~memflow.export.pipelining.stage_modules`: the traced groups keep the
model's modules, so memory policies — recompute, selective, offload, compress — run inside them
as on one device). The traced program (``split_gm``) says which values flow from group to
group, skip connections included; a value crossing to a group of another degree or other
devices is re-sharded: all-gathered from its group's ranks, each rank of the next group keeping
its share (:func:`_reshard`). Backward runs the groups in reverse, each by
``torch.autograd.backward`` of its outputs with their gradients, which flow back the same way
(an all-reduce of the full-batch gradient, each producing rank keeping its share) — the
explicit forward and backward a pipeline stage runs. Autograd-aware collectives
(``torch.distributed.nn.functional``) cannot serve: a rank outside both groups holds no
autograd graph through the value, so it would never call the backward collective its peers
wait in.

Gradients: the last group's ranks each take ``1/d`` of their share's (mean) loss, so every
rank's parameter gradients are exact parts of the full-batch gradient, summed (all-reduce) over
the ranks that hold the parameter — its group's replicas, and every group of a weight two
groups read (a tied weight). Each trace has fixed shapes, so a group is traced at its own
share of the batch (one trace per distinct share; the parameters are the model's own).

>>> from memflow.strategy import Strategy
>>> s = Strategy(["a", "b"], devices=[("gpu0", "gpu1"), ("gpu1",)], sample=[2, 1])
>>> group_ranks(s), [g.ranks for g in groups(s)]
({'gpu0': 0, 'gpu1': 1}, [(0, 1), (1,)])
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.utils import _pytree as pytree

from ..errors import ExportError
from ..strategy.runnable import sample_groups, sample_problem

__all__ = ["Group", "group_ranks", "groups", "segmented", "GroupRun"]


@dataclass(frozen=True)
class Group:
    """A run of consecutive units with one sample degree: its ranks, in share order."""

    index: int
    ranks: tuple[int, ...]

    @property
    def degree(self) -> int:
        return len(self.ranks)


def group_ranks(strategy) -> dict[str, int]:
    """The rank of each device: devices numbered in order of first appearance."""
    ranks: dict[str, int] = {}
    for devices in strategy.devices:
        for d in devices:
            ranks.setdefault(d, len(ranks))
    return ranks


def groups(strategy) -> list[Group]:
    """The strategy's sample groups, in execution order."""
    rank = group_ranks(strategy)
    ids = sample_groups(strategy)
    first = np.flatnonzero(np.r_[True, np.diff(ids) != 0])
    return [Group(k, tuple(rank[d] for d in strategy.devices[int(i)]))
            for k, i in enumerate(first)]


def segmented(strategy):
    """``strategy`` with its groups as stages of one replica: what the pipeline tracer cuts
    (:func:`~memflow.export.pipelining.stage_modules`), with the units' memory policies."""
    ids = sample_groups(strategy)
    return strategy._replace(
        stage=ids, sample=np.ones_like(ids), devices=tuple((f"group{k}",) for k in ids),
        microbatches=1, schedule="gpipe")


def _rows(args: tuple, kwargs: dict, start: int, stop: int) -> tuple[tuple, dict]:
    def cut(t):
        return t[start:stop] if isinstance(t, torch.Tensor) else t
    return tuple(map(cut, args)), {k: cut(v) for k, v in kwargs.items()}


def _batched(pipes: list) -> dict[tuple[int, int], bool]:
    """Per output ``i`` of group ``k``, whether it is split over the batch: its first
    dimension differs between the traces at different shares (GPT-2's positions do not)."""
    sizes: dict[tuple[int, int], set] = {}
    for pipe in pipes:
        for k in range(pipe.num_stages):
            out = next(n for n in pipe.get_stage_module(k).graph.nodes if n.op == "output")
            for i, node in enumerate(pytree.tree_leaves(out.args)):
                val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
                shape = tuple(val.shape) if isinstance(val, torch.Tensor) else None
                sizes.setdefault((k, i), set()).add(shape[0] if shape else None)
    return {key: len(found) > 1 for key, found in sizes.items()}


def _reshard(value, meta, src: Group, dst: Group, rank: int, batch: int):
    """Forward: ``value`` (this rank's share under ``src``, None off it) as ``dst`` shares it
    (None off ``dst``); every rank takes part (an all-gather over the default group). A value
    not split over the batch is broadcast from ``src``'s first rank whole."""
    batched, shape, dtype = meta
    if not batched:
        buf = value.detach().contiguous() if rank == src.ranks[0] else torch.empty(
            shape, dtype=dtype)
        dist.broadcast(buf, src=src.ranks[0])
        return buf if rank in dst.ranks else None
    buf = value.detach().contiguous() if value is not None else torch.zeros(
        (batch // src.degree, *shape), dtype=dtype)
    parts = [torch.empty_like(buf) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, buf)
    if rank not in dst.ranks:
        return None
    full = torch.cat([parts[r] for r in src.ranks])
    share, j = batch // dst.degree, dst.ranks.index(rank)
    return full[j * share:(j + 1) * share].clone()


def _reshard_grad(grad, meta, src: Group, dst: Group, rank: int, batch: int):
    """Backward of :func:`_reshard`: ``dst``'s gradients summed into the full value's (an
    all-reduce), each rank of ``src`` keeping its share (None off ``src``); a value not split
    over the batch gives its whole gradient to ``src``'s first rank, whose copy reached ``dst``."""
    batched, shape, dtype = meta
    full = torch.zeros((batch, *shape) if batched else shape, dtype=dtype)
    if grad is not None and batched:
        share, j = batch // dst.degree, dst.ranks.index(rank)
        full[j * share:(j + 1) * share] += grad
    elif grad is not None:
        full += grad
    dist.all_reduce(full)
    if not batched:
        return full if rank == src.ranks[0] else None
    if rank not in src.ranks:
        return None
    share, i = batch // src.degree, src.ranks.index(rank)
    return full[i * share:(i + 1) * share]


class GroupRun:
    """This rank's groups of a per-unit-degree strategy (``module``: them, running their
    memory policies) and one training step of them (:meth:`step`); every rank of the default
    process group builds it (it makes the gradient groups collectively).

    ``model`` is the whole model on every rank, ``example`` ``(args, kwargs)`` of the global
    batch (each group is traced at its share of it).
    """

    def __init__(self, model: nn.Module, strategy, example: tuple[tuple, dict], *, rank: int,
                 graph=None):
        from .pipelining import trace, traced_stage
        problem = sample_problem(strategy, graph)
        if problem is not None:
            raise ExportError(problem)
        self.rank, self.groups = rank, groups(strategy)
        devices = len(group_ranks(strategy))
        if dist.get_world_size() != devices:
            raise ExportError(f"the strategy's sample groups run on {devices} devices (a "
                              f"process each); {dist.get_world_size()} are running")
        args, kwargs = example
        self.batch = next(t.shape[0] for t in pytree.tree_leaves((args, kwargs))
                          if isinstance(t, torch.Tensor))
        odd = [g for g in self.groups if self.batch % g.degree]
        if odd:
            raise ExportError(f"sample group {odd[0].index} has degree {odd[0].degree}, which "
                              f"does not divide the batch of {self.batch}")
        seg = segmented(strategy)
        pipes: dict[int, Any] = {}
        modules: dict[int, nn.Module] = {}
        # per weight of the model (a tied weight once): the ranks holding it, and this rank's
        # tensor of it (the tracer copies a weight two groups read into each of them; on one
        # rank the copies are tied again, so the rank holds the weight once)
        holders: dict[int, set[int]] = {}
        copies: dict[int, nn.Parameter] = {}
        for g in self.groups:
            share = self.batch // g.degree
            if share not in pipes:      # one trace per share: traced shapes are fixed
                pipes[share] = trace(model, seg, _rows(args, kwargs, 0, share), graph)
            stage = pipes[share].get_stage_module(g.index)
            for name, p in list(stage.named_parameters()):
                weight = id(model.get_parameter(name))
                holders.setdefault(weight, set()).update(g.ranks)
                if rank in g.ranks and copies.setdefault(weight, p) is not p:
                    owner, _, attr = name.rpartition(".")
                    setattr(stage.get_submodule(owner), attr, copies[weight])
            if rank in g.ranks:
                modules[g.index] = traced_stage(pipes[share], seg, g.index)
        self.program = next(iter(pipes.values())).split_gm.graph
        self._batched = _batched(list(pipes.values()))
        self.module = nn.ModuleDict({str(k): m for k, m in modules.items()})
        self._modules = modules
        self._meta: dict[Any, tuple] = {}
        self._anchor = torch.zeros((), requires_grad=True)     # see _Received
        by_ranks: dict[tuple[int, ...], list[nn.Parameter]] = {}
        for p in model.parameters():        # one order on every rank
            ranks = tuple(sorted(holders.get(id(p), ())))
            if len(ranks) > 1:
                by_ranks.setdefault(ranks, []).extend([copies[id(p)]] if id(p) in copies else [])
        self._reducers = []
        for ranks in sorted(by_ranks):      # every rank makes every group, in one order
            group = dist.new_group(list(ranks))
            if rank in ranks:
                self._reducers.append((group, by_ranks[ranks]))

    def step(self, args: tuple, kwargs: dict, target: torch.Tensor,
             loss_fn: Callable) -> torch.Tensor:
        """One training step on the global batch ``(args, kwargs)`` and its ``target`` (every
        rank passes all of them; each keeps its shares): forward, backward, gradients summed
        over each parameter's holders. Returns the full batch's loss, on every rank."""
        values, ran, layout, output = self._forward(args, kwargs)
        pending: dict[int, torch.Tensor] = {}       # id of an output tensor -> its gradient
        loss = torch.zeros(())
        g = self.groups[layout]
        if self.rank in g.ranks:
            share, j = self.batch // g.degree, g.ranks.index(self.rank)
            out = next(t for t in pytree.tree_leaves(output)
                       if isinstance(t, torch.Tensor) and t.is_floating_point())
            part = loss_fn(out, target[j * share:(j + 1) * share]) / g.degree
            pending[id(out)] = torch.autograd.grad(part, out)[0]
            loss = part.detach().float()
        self._backward(values, ran, pending)
        for group, weights in self._reducers:   # each weight: its tensor on this rank
            bucket = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p))
                                .reshape(-1) for p in weights])
            dist.all_reduce(bucket, group=group)
            for p, grad in zip(weights, bucket.split([p.numel() for p in weights])):
                p.grad = grad.view_as(p)
        dist.all_reduce(loss)
        return loss

    def _forward(self, args: tuple, kwargs: dict) -> tuple[dict, list, Any, Any]:
        """The forward of this rank's groups on the global batch: per node of the program
        ``(layout, this rank's value)``; per group run ``(group, [(input node, slot of its
        gradient)], output)``; the model output's group and value (None off it)."""
        values: dict[Any, tuple[Any, Any]] = {}
        ran: list[tuple[int, list, Any]] = []
        positional = iter(args)
        for node in self.program.nodes:
            if node.op == "placeholder":
                values[node] = ("full", kwargs[node.target] if node.target in kwargs
                                else next(positional))
            elif node.op == "call_module":
                k = int(str(node.target).rsplit("_", 1)[1])
                fed = [self._input(values, a, k) for a in node.args]
                out = self._modules[k](*(x for x, _ in fed)) if k in self._modules else None
                ran.append((k, [(a, slot) for a, (_, slot) in zip(node.args, fed)], out))
                values[node] = (k, out)
            elif node.op == "call_function" and node.target is operator.getitem:
                layout, value = values[node.args[0]]
                values[node] = (layout, None if value is None else value[node.args[1]])
            elif node.op == "output":
                layout, output = values[pytree.tree_leaves(node.args)[0]]
        return values, ran, layout, output

    def forward_module(self) -> nn.Module:
        """This rank's groups as one module whose call runs the forward on the global batch
        and returns the outputs of the groups it ran (their autograd graphs): what per-rank
        validation measures held bytes of (:func:`~memflow.export.rank_measure.measure_rank`).
        Every rank calls it together (values cross between groups by collectives)."""
        return _Forward(self)

    def _input(self, values, node, k: int):
        """``node``'s value as group ``k`` holds it on this rank (None off the group), an
        input of the group's autograd graph, and the slot its gradient lands in (None where
        none flows)."""
        layout, value = values[node]
        rows = None
        if self.rank in self.groups[k].ranks:
            share, j = self.batch // self.groups[k].degree, self.groups[k].ranks.index(self.rank)
            rows = slice(j * share, (j + 1) * share)
        if layout == "full":    # a copy: the rank holds its share of the batch, not all of it
            return (None if rows is None or not isinstance(value, torch.Tensor)
                    else value[rows].clone()), None
        if layout != k:
            if node not in self._meta:      # the share's shape, from the producer's first rank
                source, i = (node.args if node.op == "call_function" else (node, 0))
                batched = self._batched[int(str(source.target).rsplit("_", 1)[1]), i]
                meta = [None if value is None else
                        (batched, tuple(value.shape[1:] if batched else value.shape),
                         value.dtype)]
                dist.broadcast_object_list(meta, src=self.groups[layout].ranks[0])
                self._meta[node] = meta[0]
            value = _reshard(value, self._meta[node], self.groups[layout], self.groups[k],
                             self.rank, self.batch)
        if value is None or not value.is_floating_point():
            return value, None
        slot: list[torch.Tensor] = []
        return _Received.apply(value.detach(), self._anchor, slot), slot

    def _backward(self, values, ran, pending) -> None:
        """Backward group by group, the last first; the gradients of the values that crossed
        from another group go back to it re-sharded (every rank takes part, in one order)."""
        for k, inputs, out in reversed(ran):
            if out is not None:
                pairs = [(t, pending.pop(id(t))) for t in pytree.tree_leaves(out)
                         if isinstance(t, torch.Tensor) and id(t) in pending]
                # a value made without grad (Llama's rotary cos and sin, from buffers) got a
                # gradient where another group received it: nothing takes it here
                pairs = [(t, g) for t, g in pairs if t.requires_grad]
                if pairs:
                    torch.autograd.backward([t for t, _ in pairs], [g for _, g in pairs])
            for node, slot in inputs:
                layout, value = values[node]
                if layout == "full":
                    continue
                grad = slot[0] if slot else None
                if layout != k:
                    if not self._meta[node][2].is_floating_point:
                        continue
                    grad = _reshard_grad(grad, self._meta[node], self.groups[layout],
                                         self.groups[k], self.rank, self.batch)
                if grad is not None and value is not None:
                    pending[id(value)] = pending[id(value)] + grad if id(value) in pending \
                        else grad


class _Received(torch.autograd.Function):
    """A value from another group entering this group's graph; its gradient is put in
    ``slot``. Not a leaf: autograd keeps a leaf alive until backward (its AccumulateGrad
    node holds it), so a first unit that offloads or recomputes its input would hold it on
    the device still. ``anchor`` (a scalar that requires grad) makes autograd record it."""

    @staticmethod
    def forward(ctx, value, anchor, slot):
        ctx.slot = slot
        return value.view_as(value)

    @staticmethod
    def backward(ctx, grad):
        ctx.slot.append(grad)
        return None, None, None


class _Forward(nn.Module):
    """:meth:`GroupRun.forward_module`: the rank's group modules (``groups``: their
    parameters are the module's) and a forward over them; ``store`` has the host copies
    their memory policies made (``host_made``), as an exported module's store has."""

    def __init__(self, run: GroupRun):
        super().__init__()
        self.groups = run.module
        self._run = run

    @property
    def store(self):
        from types import SimpleNamespace
        return SimpleNamespace(host_made=[ref for m in self.groups.values()
                                          for ref in m.store.host_made])

    def forward(self, *args: Any, **kwargs: Any) -> list:
        _, ran, _, _ = self._run._forward(args, kwargs)
        # a rank measured right after its last all-gather once counted three of its share's
        # buffers still alive (+2304 B on gpt2's rank 0, one run in three; gloo's worker
        # thread, we think, lets go of them after the call returns); a barrier waits for it
        dist.barrier()
        return [out for _, _, out in ran if out is not None]
