"""Units replicated on their tensor-parallel group, as the simulator charges them.

Where a strategy's parameter splits run as processes, a unit left unsplit runs on every
device of its group (:func:`memflow.strategy.tensor_groups.spmd_devices`): each device
computes it whole on its replica's share of the batch and holds its whole weights,
gradients and optimizer states. The simulator charges this as the strategy *as run*
(:func:`as_run`): the unit placed on its group's layout (the split units' degrees and
devices, so what it reads and saves are the records the group holds already, with no copy
between placements) and its per-unit figures scaled by the group's degree
(:func:`replicated_arrays`): a unit ``t`` times larger split ``t`` ways is the whole unit on
each part. Its own parameter degree stays 1 (:func:`split_degrees`): it exchanges nothing
within the group (no tensor-parallel all-reduce), and what it holds is never a split unit's
shard (its block is not split whole: :func:`memflow.memory.regions.whole_blocks`).

A split unit on those processes holds whole, on each device of its group, the parameters and
buffers its tensor plan does not shard — its normalizations, a row-parallel ``Linear``'s
bias, its buffers (the parameters table's ``tensor_split``, capture's record of
``memflow.graph.slicing.split_parameters``, the rule export's plan runs): each such storage is
scaled by the unit's degree (``whole``), so the ``1/p`` every model state of the unit is
charged at leaves it whole, with FSDP's or ZeRO's sharding over the replicas on top. Its
compute and exchanges stay the split unit's.

>>> import memflow
>>> from memflow.strategy import Strategy
>>> g = memflow.zoo.graph("chain", batch_size=4, units="blocks", n=3, width=8)
>>> s = Strategy.tensor_parallel(g, 2, tp=2).with_config("layers.1", parameter=1,
...                                                     devices=["gpu1"])
>>> run, scale, whole, rowwise = as_run(s, g)
>>> run.devices[1], int(run.parameter[1]), scale.tolist(), whole.tolist()
(('gpu0', 'gpu1'), 2, [1, 2, 1], [2, 2, 2])
"""
from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

import numpy as np

from ..graph.slicing import unit_pairs
from ..strategy.tensor_groups import rank_groups

__all__ = ["AsRun", "as_run", "replicated_arrays", "split_degrees"]

# per-unit figures a placement divides among the parts of a unit (weights by the parameter
# degree; compute, bytes moved and transients by every degree)
_PER_UNIT = ("param_bytes", "trainable_bytes", "buffer_bytes", "fwd_flops", "bwd_flops",
             "fwd_bytes_moved", "bwd_bytes_moved", "fwd_tmp", "bwd_tmp",
             "expensive_fwd_flops", "expensive_fwd_bytes_moved", "cached", "unpack_done")
_PER_STORAGE = ("param_grad_bytes", "param_storage_bytes")


class AsRun(NamedTuple):
    """A strategy as its processes run it (:func:`as_run`)."""

    strategy: object            # each replicated unit on its group's layout
    scale: np.ndarray | None    # per unit, the degree its figures are scaled by (1: as placed)
    whole: np.ndarray | None    # per unit, the factor of a storage its split leaves whole
    rowwise: np.ndarray | None  # per unit, a Linear run row-parallel (a pair's second)


def as_run(strategy, graph) -> AsRun:
    """``strategy`` as run: each replicated unit on its group's layout, its figures scaled
    by ``scale``, per unit the factor ``whole`` of each storage it holds whole on every
    device (module docstring: a split unit's degree, a replicated unit's ``scale``, else 1),
    and ``rowwise``, the split ``Linear`` units run row-parallel (the second of a Megatron
    pair of units, :func:`memflow.graph.slicing.unit_pairs`: their bias whole); the strategy
    itself and Nones where its splits do not run as processes. Cached on the strategy."""
    hit = strategy._cache.get("as_run")
    if hit is not None and hit[0] is graph:
        return hit[1]
    groups = rank_groups(strategy, graph)
    if groups is None:
        out = AsRun(strategy, None, None, None)
    else:
        parameter = np.asarray(strategy.parameter)
        replicas = int(strategy.sample[0])
        mine = [i for i, (g, p) in enumerate(zip(groups, parameter))
                if p == 1 and len(g) > replicas]
        run, scale = strategy, None
        if mine:
            scale = np.ones(len(strategy), np.int64)
            scale[mine] = [len(groups[i]) // replicas for i in mine]
            scale.flags.writeable = False
            devices = list(strategy.devices)
            for i in mine:
                devices[i] = groups[i]
            degree = np.maximum(parameter, scale)
            degree.flags.writeable = False
            run = strategy._replace(parameter=degree, devices=tuple(devices))
        whole = np.maximum(parameter, 1 if scale is None else scale).astype(np.int64)
        whole.flags.writeable = False
        rowwise = np.zeros(len(strategy), bool)
        rowwise[list(unit_pairs(graph, parameter, strategy.devices).values())] = True
        rowwise.flags.writeable = False
        out = AsRun(run, scale, whole, rowwise)
        run._cache["as_run"] = (graph, out)
    strategy._cache["as_run"] = (graph, out)
    return out


def split_degrees(run, degrees: np.ndarray) -> np.ndarray:
    """Per unit of ``run`` (a strategy as run, :func:`as_run`), its own parameter degree: its
    placement's (``degrees``: per layout), 1 for a unit replicated on its group."""
    p = degrees[run.layout_ids, 1]
    hit = run._cache.get("as_run")
    scale = None if hit is None else hit[1][1]
    return p if scale is None else np.where(scale > 1, 1, p)


def replicated_arrays(ga, scale: np.ndarray | None, whole: np.ndarray | None = None,
                      rowwise: np.ndarray | None = None):
    """``ga`` (:class:`~memflow.memory.arrays.GraphArrays`) with each unit's divided figures
    (``_PER_UNIT``, and its parameter storages') times ``scale``, and each storage its owner's
    split leaves whole (``param_tensor_split`` False; ``param_row_split`` for a unit run
    ``rowwise``) times ``whole`` instead, the unit's parameter, trainable and buffer bytes
    with them (:func:`as_run`); ``ga`` itself where nothing is scaled."""
    if scale is None and whole is None:
        return ga
    scale = np.ones(ga.n, np.int64) if scale is None else scale
    fixed = {c: getattr(ga, c) * scale for c in _PER_UNIT}
    fixed["unpack_tmp"] = np.where(ga.unpack_tmp < 0, ga.unpack_tmp, ga.unpack_tmp * scale)
    owner = scale[ga.param_owner]
    split = ga.param_tensor_split if rowwise is None else np.where(
        rowwise[ga.param_owner], ga.param_row_split, ga.param_tensor_split)
    factor = owner if whole is None else np.where(split, owner, whole[ga.param_owner])
    if whole is not None:       # what the storages add beyond their unit's scale
        extra = ga.param_storage_bytes * (factor - owner)
        buffer = ga.param_is_buffer
        for column, add in (("param_bytes", np.where(buffer, 0.0, extra)),
                            ("buffer_bytes", np.where(buffer, extra, 0.0)),
                            ("trainable_bytes", ga.param_grad_bytes * (factor - owner))):
            fixed[column] = fixed[column] + np.bincount(ga.param_owner, add, minlength=ga.n)
    return replace(ga, **fixed, **{c: getattr(ga, c) * factor for c in _PER_STORAGE})
