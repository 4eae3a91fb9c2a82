"""Which devices run each unit when a strategy's parameter splits run as processes: the one
rule the simulator charges and the export runs.

FlexFlow runs a unit of parameter degree 1 on its one device while the others wait. The
exported script runs a strategy with parameter splits as a process per device of each
replica's tensor-parallel group (``memflow.export.tensor_parallel``), or of each stage's group
(``memflow.export.stage_tensor``, :mod:`.stage_groups`). Every process runs the whole model but
the split units' shards (SPMD), so a unit left unsplit (an embedding without a plan, a
norm, the loss, a CNN's convolutions before a split classifier) runs on every device of its
group, on the same whole tensors: its compute, weights, gradients and optimizer states are
on each, the gradients identical there (no all-reduce in the group; averaged over the
data-parallel replicas as every weight is). :func:`spmd_devices` gives those devices. A
split unit, too, holds whole on each device what its plan leaves unsharded (its
normalizations, a row-parallel bias, buffers: the parameters table's ``tensor_split``, from
``memflow.graph.slicing.split_parameters``), on the devices :func:`rank_groups` gives.

The tensor path is taken when its groups exist (:func:`tensor_groups`; in a pipeline,
:func:`~memflow.strategy.stage_groups.stage_groups`) and no split unit is one it cannot shard
(:func:`tensor_path_problem`); else the script runs a process per replica, its units placed
as the strategy says, and nothing is replicated.

>>> from memflow.strategy import Strategy
>>> s = Strategy(["a", "b", "c"], devices=[("gpu0", "gpu1"), ("gpu1",), ("gpu0", "gpu1")],
...              parameter=[2, 1, 2])
>>> spmd_devices(s)
(None, ('gpu0', 'gpu1'), None)
>>> tensor_groups(s.with_config("c", devices=["gpu2", "gpu3"]))[:53]
"unit 'c' is split over ('gpu2', 'gpu3') but unit 'a' "
"""
from __future__ import annotations

import weakref

import numpy as np

from .policies import M_COMPRESSED, M_HOST, POLICIES
from .stage_groups import stage_groups

__all__ = ["tensor_groups", "tensor_path_problem", "rank_groups", "spmd_devices"]

# the unit kinds the tensor path shards whole (a container shards the linears inside it)
_SHARDED = ("Linear", "Embedding")


def tensor_groups(strategy) -> list[tuple[str, ...]] | str:
    """Per data-parallel replica, the devices of the parameter group every split unit of that
    replica uses (``[]`` when no unit is split), or the first reason the tensor path has no
    such groups, naming the unit: every unit the same sample degree and no attribute split,
    no pipeline stages, every split unit of a replica on one group, every unsplit unit of a
    replica on a device of its group."""
    sample, parameter = np.asarray(strategy.sample), np.asarray(strategy.parameter)
    replicas = int(sample[0])
    odd = np.flatnonzero((sample != replicas) | (np.asarray(strategy.attribute) > 1))
    if len(odd):
        i = int(odd[0])
        return (f"unit {strategy.units[i]!r} has sample degree {int(sample[i])} (unit "
                f"{strategy.units[0]!r}: {replicas}) or an attribute split; export runs "
                "tensor parallelism in whole replicas. Valid: every unit the same sample "
                "degree, attribute=1")
    staged = np.flatnonzero(np.asarray(strategy.stage) > 0)
    if len(staged):
        i = int(staged[0])
        return (f"unit {strategy.units[i]!r} is in pipeline stage {int(strategy.stage[i])}; "
                "export runs tensor parallelism inside a pipeline on the pipeline path "
                "(memflow.strategy.stage_groups)")
    groups: list[tuple[str, ...]] = []
    first = None
    for i in np.flatnonzero(parameter > 1).tolist():
        p, devs = int(parameter[i]), strategy.devices[i]
        mine = [devs[r * p:(r + 1) * p] for r in range(replicas)]
        if groups and mine != groups:
            return (f"unit {strategy.units[i]!r} is split over {devs} but unit {first!r} over "
                    f"{sum(groups, ())}; export runs one tensor-parallel group per replica: "
                    "split every unit over the same devices")
        groups, first = mine, first or strategy.units[i]
    members = [set(g) for g in groups]
    for i in np.flatnonzero(parameter == 1).tolist() if groups else ():
        for r, devs in enumerate(members):
            if strategy.devices[i][r] not in devs:
                return (f"unit {strategy.units[i]!r} runs replica {r} on "
                        f"{strategy.devices[i][r]!r}, outside that replica's tensor-parallel "
                        f"group {groups[r]}; place it on one of those devices")
    return groups


def tensor_path_problem(strategy, graph) -> str | None:
    """Why the tensor path refuses ``strategy``'s split units, from the graph alone (None: it
    takes them): a split convolution (no ``parallelize_module`` style shards one), a split
    unit offloaded or compressed (what it saves are DTensors), a split container recomputed
    (recompute cannot replay DTensor's conversions inside it). The script then runs a process
    per replica (``memflow.export.multiprocess.process_path``).

    >>> import memflow
    >>> from memflow.strategy import Strategy
    >>> g = memflow.zoo.graph("chain", batch_size=4, units="blocks", n=2, width=8)
    >>> s = Strategy.tensor_parallel(g, 2, tp=2)
    >>> tensor_path_problem(s, g) is None, tensor_path_problem(s.with_policy(recompute=["layers.0"]), g)[:40]
    (True, "unit 'layers.0' (a Dense) is split over ")
    """
    bad = _refused(strategy, graph)
    if not len(bad):
        return None
    i = int(bad[0])
    conv = _kinds(graph, len(strategy))[0]
    moved = _MOVED[strategy.policy]
    u, kind = strategy.units[i], graph.units["kind"].iat[i] if graph is not None else ""
    if conv[i]:
        return (f"unit {u!r} is a {kind} split over parameters, which tensor parallelism "
                "(parallelize_module) cannot shard")
    if moved[i]:
        return (f"unit {u!r} is split over parameters and {strategy.policies[i]!r}: what it "
                "saves for backward are DTensors, which offload and compression do not move")
    return (f"unit {u!r} (a {kind}) is split over parameters and recomputed: DTensor's "
            "conversions run inside it, which recompute cannot replay")


# per policy code: what it saves leaves the device (offloaded or compressed)
_MOVED = np.isin(POLICIES.mechanism_codes, (M_HOST, M_COMPRESSED))


def _refused(strategy, graph) -> np.ndarray:
    """The split units the tensor path refuses (:func:`tensor_path_problem`'s rules), as
    positions: every simulation of a split strategy asks, and only whether there is one."""
    split = np.asarray(strategy.parameter) > 1
    conv, container = _kinds(graph, len(split))
    replayed = POLICIES.recomputes(strategy.policy) & container
    return np.flatnonzero(split & (conv | _MOVED[strategy.policy] | replayed))


_KINDS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _kinds(graph, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per unit of ``graph`` (kept per graph: every simulation asks): a convolution, a unit
    the tensor path shards as a container (neither a Linear nor an Embedding); all False
    without a graph."""
    if graph is None:
        return np.zeros(n, bool), np.zeros(n, bool)
    hit = _KINDS.get(graph)
    if hit is None:
        kind = graph.units["kind"].to_numpy(str)
        hit = _KINDS[graph] = (np.char.startswith(kind, "Conv"), ~np.isin(kind, _SHARDED))
    return hit


def rank_groups(strategy, graph=None) -> list[tuple[str, ...]] | None:
    """Per unit, the devices of its tensor-parallel groups (every replica's, one after the
    other) where the script runs the strategy's parameter splits as a process per device of
    each group; None where it does not (no split, per-unit sample degrees, or the tensor path
    refuses it: :func:`tensor_path_problem`, ``graph`` telling). A split unit's parameters that
    its plan does not shard (a normalization's, a row-parallel bias, its buffers:
    ``memflow.graph.slicing.split_parameters``) are whole on each of those devices."""
    parameter = np.asarray(strategy.parameter)
    if not (parameter > 1).any() or (strategy.sample != strategy.sample[0]).any():
        return None
    if len(_refused(strategy, graph)):     # the tensor path's problem, without its words
        return None
    replicas = int(strategy.sample[0])
    stage = np.asarray(strategy.stage)
    if (stage > 0).any():       # the pipeline path: a group per (replica, stage)
        groups = stage_groups(strategy)
        if isinstance(groups, str):
            return None
        return [sum((groups[r, int(stage[i])] for r in range(replicas)), ())
                for i in range(len(parameter))]
    groups = tensor_groups(strategy)
    if isinstance(groups, str):
        return None
    return [sum(groups, ())] * len(parameter)


def spmd_devices(strategy, graph=None) -> tuple[tuple[str, ...] | None, ...] | None:
    """Per unit, the devices its processes each run it whole on where that is more than the
    strategy places it on — an unsplit unit's tensor-parallel groups, one per replica (module
    docstring; :func:`rank_groups`) —, None for the others; None when no unit is
    replicated."""
    mine = rank_groups(strategy, graph)
    if mine is None:
        return None
    replicas = int(strategy.sample[0])
    out = tuple(m if p == 1 and len(m) > replicas else None
                for m, p in zip(mine, strategy.parameter))
    return out if any(d is not None for d in out) else None
