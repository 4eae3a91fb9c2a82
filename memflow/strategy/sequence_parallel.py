"""Where export runs sequence parallelism (Korthikanti et al. 2022): the rule
:func:`~memflow.strategy.runnable.unrunnable` applies to a strategy's ``sequence_parallel``.

Export runs it on the tensor-parallel path (:mod:`memflow.export.tensor_parallel`), on split
Megatron blocks (a Llama decoder layer, a GPT-2 or BERT block) and normalizations: the
residual stream between them is sharded over the sequence, dimension 1 of ``(batch,
sequence, hidden)``. So a sequence-parallel unit must be such a unit, its sequence must split
evenly over its ranks (DTensor's gathers of the parts assume equal parts), and the strategy
must be one the tensor-parallel path takes: one tensor-parallel group per replica
(:func:`~memflow.strategy.tensor_groups.tensor_groups`: no pipeline stages, whose tensor
parallelism runs without it), no offloaded or compressed split unit and no recomputed split
block — the path refuses those, and the replicas' path, which would run them instead, splits
blocks in one process without sequence parallelism.
"""
from __future__ import annotations

import weakref

import numpy as np

from .._kinds import NORM_KINDS
from .policies import M_COMPRESSED, M_HOST, POLICIES
from .tensor_groups import tensor_groups

__all__ = ["sequence_units", "sequence_problem"]



def sequence_units(graph) -> np.ndarray:
    """Per unit, the sequence length its stream has where it may be sequence parallel (a
    block Megatron splits, or a normalization: dimension 1 of the output another unit reads),
    else 0.

    >>> import memflow
    >>> from memflow.zoo.llama import TINY
    >>> g = memflow.zoo.graph("tinyllama-1.1b", batch_size=2, units="blocks", **TINY)
    >>> dict(zip(g.names, sequence_units(g).tolist()))
    {'embed_tokens': 0, 'rotary': 0, 'layers.0': 16, 'layers.1': 16, 'norm': 16, 'lm_head': 0}
    """
    hit = _LENGTHS.get(id(graph))
    if hit is not None and hit[0]() is graph:
        return hit[1]
    u, t = graph.units, graph.tensors
    kind = u["kind"].to_numpy()
    may = (u["role"].to_numpy() == "module") & (
        ((u["shard_axis"].to_numpy() < 0) & (u["tensor_degree"].to_numpy() >= 1))
        | np.isin(kind, NORM_KINDS))
    index = {name: i for i, name in enumerate(graph.names)}
    out = np.zeros(len(u), np.int64)
    for prod, shape, consumers, is_out in zip(t["producer"], t["shape"], t["consumers"],
                                              t["is_output"]):
        i = index.get(prod)
        if i is None or not may[i] or len(shape) < 3 or not (
                is_out or any(c != prod for c in consumers)):
            continue
        out[i] = int(shape[1])
    out.flags.writeable = False
    if len(_LENGTHS) > 16:      # graphs long gone
        _LENGTHS.clear()
    _LENGTHS[id(graph)] = (weakref.ref(graph), out)
    return out


# per graph, its sequence_units: asked on every proposal that has sequence parallelism
_LENGTHS: dict[int, tuple[weakref.ref, np.ndarray]] = {}


def sequence_problem(strategy, graph=None) -> str | None:
    """Why export cannot run ``strategy``'s sequence parallelism (None: it can, or no unit
    has it); which units may have it is checked only with ``graph`` (module docstring).

    >>> import memflow
    >>> from memflow.strategy import Strategy
    >>> from memflow.zoo.llama import TINY
    >>> g = memflow.zoo.graph("tinyllama-1.1b", batch_size=4, units="blocks", **TINY)
    >>> s = Strategy.tensor_parallel(g, 2, tp=2, sequence_parallel=True)
    >>> sequence_problem(s, g) is None
    True
    >>> sequence_problem(s.with_policy(offload=["layers.0"]), g)[:72]
    "unit 'layers.0' is split over parameters and offloaded or compressed; ex"
    """
    seq = np.asarray(strategy.sequence_parallel)
    if not seq.any():
        return None
    units = list(strategy.units)
    first = units[int(seq.argmax())]
    groups = tensor_groups(strategy)
    if isinstance(groups, str):
        return (f"unit {first!r} is sequence parallel, which export runs on the "
                f"tensor-parallel path only, and {groups}. Valid: sequence_parallel=False")
    split = np.asarray(strategy.parameter) > 1
    moved = np.isin(POLICIES.mechanism_codes[strategy.policy], (M_HOST, M_COMPRESSED))
    redone = POLICIES.recomputes(strategy.policy)
    blocks = np.ones(len(units), bool)
    if graph is not None:
        lengths = sequence_units(graph)
        parameter = np.asarray(strategy.parameter)
        odd = np.flatnonzero(seq & ((lengths == 0) | (lengths % np.maximum(parameter, 1) > 0)))
        if len(odd):
            i = int(odd[0])
            what = (f"its sequence of {int(lengths[i])} does not split {int(parameter[i])} ways"
                    if lengths[i] else "it is no block Megatron splits (nor a normalization)")
            return (f"unit {units[i]!r} is sequence parallel, but {what}. Valid: "
                    "sequence_parallel=False for it")
        blocks = graph.units["shard_axis"].to_numpy() < 0
    for i in np.flatnonzero(split & moved):
        return (f"unit {units[int(i)]!r} is split over parameters and offloaded or "
                "compressed; export runs that on the replicas' path, which has no sequence "
                f"parallelism (unit {first!r} has it). Valid: keep or recompute it, or "
                "sequence_parallel=False")
    for i in np.flatnonzero(split & redone & blocks):
        return (f"unit {units[int(i)]!r} is a split block and recomputed; export runs that on "
                "the replicas' path, which has no sequence parallelism (unit "
                f"{first!r} has it). Valid: keep it, or sequence_parallel=False")
    return None
