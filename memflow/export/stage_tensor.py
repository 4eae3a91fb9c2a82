"""Tensor parallelism inside pipeline stages (TP × PP, as torchtitan composes them).

A pipelined strategy whose units in each stage are split over ``t`` devices per replica runs
``replicas × stages × t`` processes: rank ``(r * stages + s) * t + k`` is device ``k`` of the
tensor-parallel group of stage ``s`` of replica ``r`` (:func:`stage_groups`, the rule in
:mod:`memflow.strategy.stage_groups`). Unsplit units of a stage run on every rank of its group
(SPMD), as on the tensor-parallel path.

The stage is cut by pipelining's tracer (:mod:`memflow.export.pipelining`), whose modules are
``InterpreterModule``s that ``parallelize_module``'s styles do not take; but the tracer keeps
each ``Linear`` and ``Embedding`` a module of its own, called on its one input. So the plan
is made on the model itself (:func:`~memflow.export.tensor_parallel.tensor_plan`: Megatron
pairs and blocks, gathered columns), and in the stage each planned leaf is swapped for a real
``nn.Linear`` / ``nn.Embedding`` holding the stage's own weights before the styles shard them
(:func:`parallelize_stage`). The traced attention reads its head count from the width it
gets (the trace keeps ``view(b, s, -1, head_dim)``), so a rank runs its heads.

>>> from memflow.strategy import Strategy
>>> s = Strategy(["a", "b"], devices=[("gpu0", "gpu1"), ("gpu2", "gpu3")], parameter=[2, 2],
...              stage=[0, 1], microbatches=2)
>>> stage_groups(s)
{(0, 0): ('gpu0', 'gpu1'), (0, 1): ('gpu2', 'gpu3')}
"""
from __future__ import annotations

from torch import nn

from ..errors import ExportError
from ..strategy.stage_groups import split_degree
from ..strategy.stage_groups import stage_groups as groups_of

__all__ = ["stage_tensor_degree", "stage_groups", "stage_plan", "parallelize_stage"]


def stage_tensor_degree(strategy) -> int:
    """The degree ``t`` of every split unit of a pipelined strategy (1: none is split)."""
    t = split_degree(strategy)
    if isinstance(t, str):
        raise ExportError(t)
    return t


def stage_groups(strategy) -> dict[tuple[int, int], tuple[str, ...]]:
    """The devices of the tensor-parallel group of each ``(replica, stage)``
    (:func:`memflow.strategy.stage_groups.stage_groups`: its reason raised here)."""
    groups = groups_of(strategy)
    if isinstance(groups, str):
        raise ExportError(groups)
    return groups


def stage_plan(model: nn.Module, strategy, graph=None) -> dict[str, str]:
    """Module path -> style of every module the split units shard, as the tensor-parallel
    path would plan them on one group (its refusals too: a split unit offloaded, a split
    block recomputed)."""
    from .tensor_parallel import tensor_plan
    t = stage_tensor_degree(strategy)
    group = tuple(f"tp{k}" for k in range(t))
    flat = type(strategy)(strategy.units,
                          devices=[group if p > 1 else group[:1] for p in strategy.parameter],
                          parameter=strategy.parameter, policy=strategy.policy,
                          error_bound=strategy.error_bound,
                          segment_break=strategy.segment_break)
    return tensor_plan(model, flat, graph)


def parallelize_stage(stage: nn.Module, model: nn.Module, plan: dict[str, str], mesh) -> None:
    """Shard traced ``stage`` (in place) on ``mesh`` (its tensor-parallel group) by the
    entries of ``plan`` it holds, each traced leaf swapped first for a real module of
    ``model``'s kind holding the stage's weights (module docstring)."""
    from torch.distributed.tensor.parallel import parallelize_module
    from .tp_styles import styles
    made, mine = styles(), {}
    for path, style in plan.items():
        if style not in made:
            continue            # sequence parallelism: not inside stages
        try:
            traced = stage.get_submodule(path)
        except AttributeError:
            continue            # in another stage
        like = model.get_submodule(path)
        if isinstance(like, nn.Embedding):
            real = nn.Embedding(like.num_embeddings, like.embedding_dim,
                                padding_idx=like.padding_idx, device="meta")
        else:
            real = nn.Linear(like.in_features, like.out_features, bias=like.bias is not None,
                             device="meta")
        for name, _ in list(real.named_parameters()):
            setattr(real, name, traced.get_parameter(name))
        parent, _, attr = path.rpartition(".")
        setattr(stage.get_submodule(parent) if parent else stage, attr, real)
        mine[path] = made[style]()
    parallelize_module(stage, mesh, mine)
