"""Tensor-parallel groups inside pipeline stages (TP × PP): the rule, written once, that
:mod:`memflow.strategy.runnable` admits and :mod:`memflow.export.stage_tensor` runs.

Every split unit of a pipelined strategy has one degree ``t``; replica ``r``'s part of stage
``s`` runs on one group of ``t`` devices — the devices of each split unit of that stage — and
its unsplit units on a device of that group (the export runs them on every rank of the group);
every stage holds a split unit; the groups are disjoint. The process of device ``k`` of the
group of ``(r, s)`` is rank ``(r * stages + s) * t + k``.

>>> from memflow.strategy import Strategy
>>> s = Strategy(["a", "b", "c"], devices=[("gpu0", "gpu1"), ("gpu1",), ("gpu2", "gpu3")],
...              parameter=[2, 1, 2], stage=[0, 0, 1], microbatches=2)
>>> stage_groups(s)
{(0, 0): ('gpu0', 'gpu1'), (0, 1): ('gpu2', 'gpu3')}
>>> stage_groups(s.with_config("c", parameter=1, devices=["gpu2"]))[:58]
"stage 1 (unit 'c') has no split unit but other stages are "
"""
from __future__ import annotations

import numpy as np

__all__ = ["split_degree", "stage_groups"]


def split_degree(strategy) -> int | str:
    """The degree of every split unit (1: none is split), or why there is no one degree."""
    degrees = sorted(set(int(p) for p in strategy.parameter if p > 1))
    if len(degrees) > 1:
        return (f"units inside pipeline stages are split {degrees[0]} and {degrees[1]} ways; "
                "export runs one tensor-parallel degree in every stage. Valid: parameter "
                f"{degrees[0]} or 1 for every unit")
    return degrees[0] if degrees else 1


def stage_groups(strategy) -> dict[tuple[int, int], tuple[str, ...]] | str:
    """The devices of each ``(replica, stage)``'s tensor-parallel group (module docstring),
    or the first reason the strategy has no such groups, naming the unit."""
    t = split_degree(strategy)
    if isinstance(t, str):
        return t
    replicas, stage = int(strategy.sample[0]), np.asarray(strategy.stage)
    groups: dict[tuple[int, int], tuple[str, ...]] = {}
    for i in np.flatnonzero(np.asarray(strategy.parameter) > 1):
        for r in range(replicas):
            mine = tuple(strategy.devices[i][r * t:(r + 1) * t])
            if groups.setdefault((r, int(stage[i])), mine) != mine:
                return (f"unit {strategy.units[i]!r} is split over {mine} but another unit of "
                        f"stage {int(stage[i])} over {groups[r, int(stage[i])]}; export runs "
                        "one tensor-parallel group per stage: split its units over the same "
                        "devices")
    for i, u in enumerate(strategy.units):
        for r in range(replicas):
            group = groups.get((r, int(stage[i])))
            if group is None:
                return (f"stage {int(stage[i])} (unit {u!r}) has no split unit but other "
                        f"stages are split {t} ways; export runs every stage on a group of "
                        f"{t} processes. Valid: split a unit of each stage over its devices, "
                        "or no split")
            if int(strategy.parameter[i]) == 1 and strategy.devices[i][r] not in group:
                return (f"unit {u!r} runs replica {r} on {strategy.devices[i][r]!r}, outside "
                        f"its stage's tensor-parallel group {group}; place it on one of those "
                        "devices")
    owner: dict[str, tuple[int, int]] = {}
    for key, group in groups.items():
        for d in group:
            if owner.setdefault(d, key) != key:
                return (f"device {d!r} is in the groups of (replica, stage) {owner[d]} and "
                        f"{key}; export runs each stage of each replica on its own devices")
    return dict(sorted(groups.items()))
