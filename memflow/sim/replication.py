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

>>> import memflow
>>> from memflow.strategy import Strategy
>>> g = memflow.zoo.graph("chain", batch_size=4, units="blocks", n=3, width=8)
>>> s = Strategy.tensor_parallel(g, 2, tp=2).with_config("layers.1", parameter=1,
...                                                     devices=["gpu1"])
>>> run, scale = as_run(s, g)
>>> run.devices[1], int(run.parameter[1]), scale.tolist()
(('gpu0', 'gpu1'), 2, [1, 2, 1])
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..strategy.tensor_groups import spmd_devices

__all__ = ["as_run", "replicated_arrays", "split_degrees"]

# per-unit figures a placement divides among the parts of a unit (weights by the parameter
# degree; compute, bytes moved and transients by every degree)
_PER_UNIT = ("param_bytes", "trainable_bytes", "buffer_bytes", "fwd_flops", "bwd_flops",
             "fwd_bytes_moved", "bwd_bytes_moved", "fwd_tmp", "bwd_tmp",
             "expensive_fwd_flops", "expensive_fwd_bytes_moved", "cached", "unpack_done")
_PER_STORAGE = ("param_grad_bytes", "param_storage_bytes")


def as_run(strategy, graph):
    """``(strategy as run, scale)``: the strategy with each replicated unit on its group's
    layout, and per unit the degree its figures are scaled by (1: charged as placed); the
    strategy itself and None when nothing is replicated. Cached on the strategy."""
    hit = strategy._cache.get("as_run")
    if hit is not None and hit[0] is graph:
        return hit[1]
    spmd = spmd_devices(strategy, graph)
    if spmd is None:
        out = (strategy, None)
    else:
        mine = [i for i, d in enumerate(spmd) if d is not None]
        scale = np.ones(len(strategy), np.int64)
        scale[mine] = [len(spmd[i]) for i in mine]
        scale[mine] //= strategy.sample[mine]
        scale.flags.writeable = False
        devices = list(strategy.devices)
        for i in mine:
            devices[i] = spmd[i]
        parameter = np.maximum(strategy.parameter, scale)
        parameter.flags.writeable = False
        run = strategy._replace(parameter=parameter, devices=tuple(devices))
        out = (run, scale)
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


def replicated_arrays(ga, scale: np.ndarray | None):
    """``ga`` (:class:`~memflow.memory.arrays.GraphArrays`) with each unit's divided figures
    (``_PER_UNIT``, and its parameter storages') times ``scale`` (:func:`as_run`); ``ga``
    itself where nothing is scaled."""
    if scale is None:
        return ga
    owner = scale[ga.param_owner]
    fixed = {c: getattr(ga, c) * scale for c in _PER_UNIT}
    fixed["unpack_tmp"] = np.where(ga.unpack_tmp < 0, ga.unpack_tmp, ga.unpack_tmp * scale)
    return replace(ga, **fixed, **{c: getattr(ga, c) * owner for c in _PER_STORAGE})
