"""A graph's numbers as numpy arrays and plain lists, made once per graph and cached.

The memory plan, ``memflow.estimate`` and the simulator read these instead of the DataFrames.
Unit references are positions in execution order; the model's inputs are producer ``-1``.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np

from ..graph.mapkind import kind_code
from ..graph.opgraph import INPUT
from .regions import internal_tensors, unit_blocks

__all__ = ["GraphArrays", "graph_arrays", "csr"]

_HALF = {"float16", "bfloat16", "torch.float16", "torch.bfloat16", "half"}


@dataclass(frozen=True)
class GraphArrays:
    """Per-unit and per-tensor arrays of one :class:`~memflow.graph.OpGraph`."""

    names: tuple[str, ...]
    param_bytes: np.ndarray
    trainable_bytes: np.ndarray
    buffer_bytes: np.ndarray
    fwd_flops: np.ndarray
    bwd_flops: np.ndarray
    fwd_bytes_moved: np.ndarray
    bwd_bytes_moved: np.ndarray
    fwd_ops: np.ndarray
    bwd_ops: np.ndarray
    fwd_tmp: np.ndarray
    bwd_tmp: np.ndarray
    half: np.ndarray            # unit computes in fp16/bf16
    block: np.ndarray           # first unit of the unit's block (:mod:`.regions`)
    recomputable: np.ndarray
    # selective recomputation: the forward cost of the unit's expensive ops, and the bytes of
    # their outputs used only inside it (held by a selective unit until its recomputation)
    expensive_fwd_flops: np.ndarray
    expensive_fwd_bytes_moved: np.ndarray
    expensive_fwd_ops: np.ndarray
    cached: np.ndarray
    unpack_tmp: np.ndarray      # bwd_tmp were what it saved compressed (node by node); -1: unknown
    unpack_done: np.ndarray     # … unpacked by the nodes run before that peak
    # tensors
    bytes: np.ndarray
    producer: np.ndarray        # unit position, -1 for the model's inputs
    is_output: np.ndarray
    requires_grad: np.ndarray
    per_sample: np.ndarray
    expensive: np.ndarray       # made by an expensive op
    map_kind: np.ndarray        # its values' kind: a position in graph.mapkind.MAP_KINDS
    stream: np.ndarray          # between tensor-parallel regions (:func:`stream_tensors`)
    internal: np.ndarray        # read only inside its producer's block (:mod:`.regions`)
    readers: tuple[tuple[int, ...], ...]   # distinct forward readers other than the producer
    savers: tuple[tuple[int, ...], ...]    # distinct savers, in execution order
    batch_size: int | None
    keep_output: bool           # the step keeps the model's outputs until backward ends
    # the same as CSR arrays (row ``t`` is ``idx[ptr[t]:ptr[t + 1]]``), for vectorised code
    readers_ptr: np.ndarray
    readers_idx: np.ndarray
    savers_ptr: np.ndarray
    savers_idx: np.ndarray
    # parameter storages (``graph.parameters``, tied weights once)
    param_owner: np.ndarray       # unit holding the storage (weights, optimizer state)
    param_grad_bytes: np.ndarray  # bytes of its gradient: the storage's if trainable, else 0
    param_grad_unit: np.ndarray   # unit whose backward makes its gradient: the last reader
    param_readers_ptr: np.ndarray  # CSR: the units whose forward reads it
    param_readers_idx: np.ndarray
    param_storage_bytes: np.ndarray  # bytes of the storage
    param_is_buffer: np.ndarray
    param_tensor_split: np.ndarray   # a split of its owner shards it (else whole on each rank)
    param_row_split: np.ndarray      # ... its owner, a Linear unit, run row-parallel

    @property
    def n(self) -> int:
        return len(self.names)


def csr(rows) -> tuple[np.ndarray, np.ndarray]:
    """``(ptr, idx)`` of a list of integer sequences: row ``k`` is ``idx[ptr[k]:ptr[k + 1]]``.

    >>> [a.tolist() for a in csr([[1, 2], [], [3]])]
    [[0, 2, 2, 3], [1, 2, 3]]
    """
    lens = np.fromiter((len(r) for r in rows), np.int64, len(rows))
    ptr = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(lens, out=ptr[1:])
    return ptr, np.fromiter((x for r in rows for x in r), np.int64, int(ptr[-1]))


def stream_tensors(shapes, producer: np.ndarray, leaves: np.ndarray) -> np.ndarray:
    """Per tensor: it is token-wise, ``(batch, sequence, features)``, with the shape of its
    producer's first output (the tensor ``leaves`` marks; ``producer`` may be the producer's
    block, :mod:`.regions`, whose first output leaves the block) or that shape with one
    feature — in a transformer block, the residual stream between Megatron's tensor-parallel regions
    (LayerNorm inputs, outputs and statistics, dropout masks), which tensor parallelism
    replicates and sequence parallelism splits. A tensor of unknown shape is not one, nor one
    of another rank (a convolution's maps: a split block's channels are split).

    >>> stream_tensors([[2, 8, 4], [2, 8, 4], [2, 8, 1], [2, 8, 16], [], [2, 8, 4, 4]],
    ...                np.zeros(6, np.int64), np.array([False, True, False, False, False, False])
    ...                ).tolist()
    [True, True, True, False, False, False]
    """
    out_shape: dict[int, tuple] = {}
    for p, shape, leaf in zip(producer.tolist(), shapes, leaves.tolist()):
        if leaf and p not in out_shape and len(shape):
            out_shape[p] = tuple(shape)
    out = np.zeros(len(producer), bool)
    for i, (p, shape) in enumerate(zip(producer.tolist(), shapes)):
        ref = out_shape.get(p)
        out[i] = (ref is not None and len(shape) == len(ref) == 3
                  and tuple(shape[:-1]) == ref[:-1] and shape[-1] in (ref[-1], 1))
    return out


_CACHE: "weakref.WeakKeyDictionary[object, GraphArrays]" = weakref.WeakKeyDictionary()


def graph_arrays(graph) -> GraphArrays:
    """The arrays of ``graph`` (cached for the graph object's lifetime).

    >>> import pandas as pd
    >>> from memflow.graph import OpGraph
    >>> g = OpGraph(pd.DataFrame({"fwd_flops": [1.0, 1.0], "bwd_flops": [2.0, 2.0]},
    ...                          index=["a", "b"]),
    ...             pd.DataFrame({"bytes": [8, 16], "producer": ["<input>", "a"],
    ...                           "consumers": [["a"], ["b"]], "savers": [["a"], ["a", "b"]]}))
    >>> ga = graph_arrays(g)
    >>> ga.producer.tolist(), ga.readers, ga.savers
    ([-1, 0], ((0,), (1,)), ((0,), (0, 1)))
    """
    cached = _CACHE.get(graph)
    if cached is not None:
        return cached
    u, t = graph.units, graph.tensors
    pos = {name: i for i, name in enumerate(u.index)}
    pos[INPUT] = -1

    def col(name, dtype=np.float64):
        return np.ascontiguousarray(u[name].to_numpy(dtype))

    producer = np.array([pos[p] for p in t["producer"]], np.int64)
    readers, savers = [], []
    for p, cons, sav in zip(producer.tolist(), t["consumers"], t["savers"]):
        readers.append(tuple(sorted({pos[c] for c in cons} - {p})))
        savers.append(tuple(sorted({pos[s] for s in sav})))
    r_ptr, r_idx = csr(readers)
    s_ptr, s_idx = csr(savers)
    pt = graph.parameters
    p_owner = np.array([pos[o] for o in pt["owner"]], np.int64)
    p_readers = [tuple(pos[r] for r in rs) for rs in pt["readers"]]
    pr_ptr, pr_idx = csr(p_readers)
    # an unread parameter gets its gradient (if any) where its owner's backward runs
    p_grad_unit = np.array([rs[-1] if rs else o for rs, o in zip(p_readers, p_owner.tolist())],
                           np.int64)
    block = unit_blocks(u["block"] if "block" in u.columns else [""] * len(u))
    is_output = t["is_output"].to_numpy(bool)
    internal = internal_tensors(producer, r_ptr, r_idx, is_output, block)
    recomputable = (u["recomputable"].to_numpy(bool) if "recomputable" in u.columns
                    else np.ones(len(u), bool))
    out = GraphArrays(
        names=tuple(u.index), param_bytes=col("param_bytes"),
        trainable_bytes=col("trainable_bytes"), buffer_bytes=col("buffer_bytes"),
        fwd_flops=col("fwd_flops"), bwd_flops=col("bwd_flops"),
        fwd_bytes_moved=col("fwd_bytes_moved"), bwd_bytes_moved=col("bwd_bytes_moved"),
        fwd_ops=col("fwd_ops"), bwd_ops=col("bwd_ops"), fwd_tmp=col("fwd_tmp_bytes"),
        bwd_tmp=col("bwd_tmp_bytes"),
        half=np.array([str(d) in _HALF for d in u["dtype"]], bool), block=block,
        recomputable=recomputable,
        expensive_fwd_flops=col("expensive_fwd_flops"),
        expensive_fwd_bytes_moved=col("expensive_fwd_bytes_moved"),
        expensive_fwd_ops=col("expensive_fwd_ops"), cached=col("cached_bytes"),
        unpack_tmp=col("unpack_tmp_bytes"),
        unpack_done=col("unpack_done_bytes"),
        bytes=t["bytes"].to_numpy(np.float64), producer=producer,
        is_output=is_output, requires_grad=t["requires_grad"].to_numpy(bool),
        per_sample=t["per_sample"].to_numpy(bool), expensive=t["expensive"].to_numpy(bool),
        map_kind=np.array([kind_code(k) for k in t["map_kind"]], np.int64),
        stream=stream_tensors(t["shape"], np.where(producer >= 0, block[producer], -1),
                              ~internal & ((producer >= 0) | (r_ptr[1:] > r_ptr[:-1])
                                           | is_output)),
        internal=internal,
        readers=tuple(readers),
        savers=tuple(savers), batch_size=graph.meta.get("batch_size"),
        keep_output=bool(graph.meta.get("keep_output", False)), readers_ptr=r_ptr,
        readers_idx=r_idx, savers_ptr=s_ptr, savers_idx=s_idx, param_owner=p_owner,
        param_grad_bytes=np.where(pt["trainable"].to_numpy(bool),
                                  pt["bytes"].to_numpy(np.float64), 0.0),
        param_grad_unit=p_grad_unit, param_readers_ptr=pr_ptr, param_readers_idx=pr_idx,
        param_storage_bytes=pt["bytes"].to_numpy(np.float64),
        param_is_buffer=pt["is_buffer"].to_numpy(bool),
        param_tensor_split=pt["tensor_split"].to_numpy(bool),
        param_row_split=pt["row_split"].to_numpy(bool))
    _CACHE[graph] = out
    return out
