"""Ready-made strategies: one device, data, model, hybrid, pipeline and tensor parallelism.

Every constructor takes the graph (for its units, their cost and their largest splits) and the
devices to use: a :class:`memflow.Cluster` (all its devices), a number ``n`` (``gpu0`` …
``gpu{n-1}``) or a list of device names.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..errors import StrategyError
from .strategy import Strategy
from .validate import block_limits, divides_tensor_degree

__all__ = ["device_list", "balanced_split", "single_device", "data_parallel", "model_parallel",
           "hybrid", "pipeline", "tensor_parallel"]

Devices = Any  # Cluster | int | Sequence[str]


def device_list(devices: Devices) -> list[str]:
    """Device names from a cluster, a count or a list.

    >>> device_list(3)
    ['gpu0', 'gpu1', 'gpu2']
    """
    if hasattr(devices, "devices") and hasattr(devices.devices, "index"):
        return [str(d) for d in devices.devices.index]
    if isinstance(devices, (int, np.integer)):
        if devices < 1:
            raise StrategyError(f"need at least one device, got {devices}")
        return [f"gpu{i}" for i in range(int(devices))]
    if isinstance(devices, str):
        return [devices]
    out = [str(d) for d in devices]
    if not out:
        raise StrategyError("need at least one device, got an empty list")
    return out


def balanced_split(cost: np.ndarray, parts: int) -> np.ndarray:
    """Contiguous chunk index per item so that the chunks' costs are about equal.

    Each item goes to the chunk where the middle of its cost falls; every chunk gets at least
    one item when there are enough items.

    >>> balanced_split(np.array([1., 1., 1., 1., 4.]), 2).tolist()
    [0, 0, 0, 0, 1]
    """
    n = len(cost)
    if parts > n:
        raise StrategyError(f"cannot split {n} units into {parts} non-empty contiguous parts; "
                            f"use at most {n} parts")
    cost = np.asarray(cost, np.float64) + 1e-12 * max(float(np.sum(cost)), 1.0)
    mid = np.cumsum(cost) - cost / 2
    chunk = np.minimum((mid / cost.sum() * parts).astype(np.int64), parts - 1)
    # force non-empty chunks: chunk k starts no later than item n-parts+k and no earlier than k
    chunk = np.maximum(chunk, np.arange(n) - (n - parts))
    chunk = np.minimum(chunk, np.arange(n))
    return np.maximum.accumulate(chunk)


def _cost(graph) -> np.ndarray:
    u = graph.units
    return (u["fwd_flops"] + u["bwd_flops"]).to_numpy(np.float64)


def single_device(graph, device: str = "gpu0", *, name: str = "single device") -> Strategy:
    """Every unit on ``device``, everything kept.

    >>> import pandas as pd
    >>> from memflow.graph import OpGraph
    >>> g = OpGraph(pd.DataFrame({"fwd_flops": [1.0, 1.0], "bwd_flops": [2.0, 2.0]},
    ...                          index=["a", "b"]),
    ...             pd.DataFrame({"bytes": [8], "producer": ["<input>"], "consumers": [["a"]]}))
    >>> single_device(g).devices
    (('gpu0',), ('gpu0',))
    """
    return Strategy(graph.names, devices=[(str(device),)] * len(graph), name=name)


def data_parallel(graph, devices: Devices, *, shard: str = "none", precision: str | None = None,
                  name: str | None = None) -> Strategy:
    """Every unit replicated on all devices, the batch split between them: DDP, or with
    ``shard`` (a level of :data:`~memflow.strategy.SHARD_LEVELS`) ZeRO-1/2/3 and FSDP full
    shard; ``precision`` (:data:`~memflow.strategy.PRECISIONS`; None: the simulator's).

    >>> import pandas as pd
    >>> from memflow.graph import OpGraph
    >>> g = OpGraph(pd.DataFrame({"fwd_flops": [1.0], "bwd_flops": [2.0]}, index=["fc"]),
    ...             pd.DataFrame({"bytes": [8], "producer": ["<input>"], "consumers": [["fc"]]}))
    >>> s = data_parallel(g, 8, shard="parameters", precision="bf16")
    >>> s.name, s.shard_levels, s.precision
    ('data parallel, shard parameters', ['parameters'], 'bf16')
    """
    devs = tuple(device_list(devices))
    return Strategy(graph.names, devices=[devs] * len(graph), sample=[len(devs)] * len(graph),
                    shard=shard, precision=precision,
                    name=name or "data parallel" + (f", shard {shard}" if shard != "none" else ""))


def model_parallel(graph, devices: Devices, *, name: str = "model parallel") -> Strategy:
    """Contiguous runs of units, one run per device, balanced by FLOPs (no pipelining)."""
    return hybrid(graph, devices, dp=1, mp=len(device_list(devices)), name=name)


def hybrid(graph, devices: Devices, *, dp: int, mp: int, name: str | None = None) -> Strategy:
    """``dp`` data-parallel replicas, each split over ``mp`` devices by contiguous runs.

    Replica ``r``'s ``s``-th run is on device ``r * mp + s`` (model parallelism over adjacent
    devices, which share the fastest links).
    """
    devs = device_list(devices)
    if dp * mp != len(devs):
        raise StrategyError(f"hybrid: dp × mp = {dp} × {mp} = {dp * mp} but {len(devs)} devices "
                            "were given; choose dp and mp whose product is the device count")
    chunk = balanced_split(_cost(graph), mp)
    placed = [tuple(devs[r * mp + int(c)] for r in range(dp)) for c in chunk]
    return Strategy(graph.names, devices=placed, sample=[dp] * len(graph),
                    name=name or f"hybrid dp={dp} mp={mp}")


def pipeline(graph, devices: Devices, *, stages: int, microbatches: int, dp: int = 1,
             schedule: str = "1f1b", name: str | None = None) -> Strategy:
    """``stages`` pipeline stages balanced by FLOPs, ``dp`` replicas of the pipeline."""
    s = hybrid(graph, devices, dp=dp, mp=stages)
    stage = balanced_split(_cost(graph), stages)
    return Strategy(s.units, devices=s.devices, sample=s.sample, stage=stage,
                    microbatches=microbatches, schedule=schedule,
                    name=name or f"pipeline {stages} stages × {microbatches} microbatches"
                    + (f", dp={dp}" if dp > 1 else ""))


def tensor_parallel(graph, devices: Devices, *, tp: int, pp: int = 1, dp: int = 1,
                    microbatches: int = 1, schedule: str = "1f1b",
                    sequence_parallel: bool = False, whole_blocks: bool = False,
                    name: str | None = None) -> Strategy:
    """Megatron-style tensor × pipeline × data parallelism, with ``sequence_parallel`` its
    sequence parallelism on every split unit.

    Device ``(r * pp + s) * tp + t`` is tensor rank ``t`` of stage ``s`` of replica ``r``.
    Units that hold parameters and can be split ``tp`` ways over their parameter dimension
    (blocks whose ``tensor_degree`` ``tp`` divides, embeddings, large linears) get
    ``parameter=tp``; the rest are placed on tensor rank 0 of their stage, and run on every
    rank of its group (:mod:`memflow.strategy.tensor_groups`). With ``whole_blocks`` the units of a block (the graph's ``block`` column: a
    layer captured finer than ``"blocks"``) split together, parameter-free ones included, when
    its parameter units all can — Megatron's layer, whose attention core and GELU run on each
    rank's heads and features (the memory model holds what they pass among themselves at
    ``1/tp``: :mod:`memflow.memory.regions`; export splits only units holding a ``Linear`` or
    ``Embedding``). The simulator charges each split unit an all-reduce of its output in
    forward and of its input gradient in backward (under sequence parallelism a
    reduce-scatter and an all-gather: the same bytes on a ring). ``sequence_parallel`` marks
    the split units between tensor-parallel regions that pass token-wise tensors ``(batch,
    sequence, features)`` (transformer blocks, their normalizations); a split ``Linear`` or
    ``Embedding`` is a region itself.

    >>> import memflow
    >>> g = memflow.zoo.graph("gpt2", batch_size=2, n_layer=2, hidden=64, n_head=4,
    ...                       seq_len=32, vocab=100, units="blocks")
    >>> s = tensor_parallel(g, 2, tp=2, sequence_parallel=True)
    >>> s.name, s.units[s.sequence_parallel.argmax()]
    ('tp=2 pp=1 dp=1 sp', 'h.0')
    >>> leaves = memflow.zoo.graph("gpt2", batch_size=2, n_layer=1, hidden=64, n_head=4,
    ...                            seq_len=32, vocab=100)
    >>> w = tensor_parallel(leaves, 2, tp=2, whole_blocks=True)
    >>> w.name, int(w.parameter[leaves.names.index("h.0.mlp.act")])
    ('tp=2 pp=1 dp=1 blocks', 2)
    """
    devs = device_list(devices)
    u = graph.units
    # with whole_blocks, a unit inside a block (a layer captured finer) splits with its block
    block = u["block"].to_numpy(str) if "block" in u.columns else np.full(len(u), "")
    inside = (block != "") & whole_blocks
    # sequence parallelism: units between the regions that pass token-wise tensors; a block's
    # units when the block passes them
    t = graph.tensors
    token_wise = set(t["producer"][[len(x) == 3 for x in t["shape"]]]) if "shape" in t else set()
    passes = np.isin(graph.names, list(token_wise))
    between = np.where(inside, np.isin(block, block[passes & inside]),
                       ~u.get("kind", pd.Series("", u.index)).isin(
                           ("Linear", "Embedding", "Conv1d", "Conv2d", "Conv3d")).to_numpy()
                       & passes)
    if tp * pp * dp != len(devs):
        raise StrategyError(f"tensor_parallel: tp × pp × dp = {tp * pp * dp} but {len(devs)} "
                            "devices were given; choose degrees whose product is the count")
    limit = np.where(inside, block_limits(u), u["max_parameter_degree"].to_numpy())
    # a block Megatron splits (its tensor_degree) only where tp divides its heads and widths
    even = divides_tensor_degree(u["tensor_degree"].to_numpy(), tp) | inside
    split = (limit >= tp) & even & ((u["param_bytes"].to_numpy() > 0) | inside) & (tp > 1)
    stage = balanced_split(_cost(graph), pp)
    placed, param = [], []
    for i in range(len(graph)):
        ranks = range(tp) if split[i] else range(1)
        placed.append(tuple(devs[(r * pp + int(stage[i])) * tp + t]
                            for r in range(dp) for t in ranks))
        param.append(tp if split[i] else 1)
    return Strategy(graph.names, devices=placed, sample=[dp] * len(graph), parameter=param,
                    stage=stage if pp > 1 else None, microbatches=microbatches,
                    sequence_parallel=(np.array(param) > 1) & between
                    if sequence_parallel else None,
                    schedule=schedule,
                    name=name or f"tp={tp} pp={pp} dp={dp}" + (" sp" if sequence_parallel else "")
                    + (" blocks" if whole_blocks else ""))


def _attach() -> None:
    # The constructors are also classmethods of Strategy, where users look for them.
    for fn in (single_device, data_parallel, model_parallel, hybrid, pipeline, tensor_parallel):
        setattr(Strategy, fn.__name__, staticmethod(fn))


_attach()
