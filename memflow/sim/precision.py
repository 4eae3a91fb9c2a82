"""What a strategy's precision does to its activations. A ``bf16`` or ``pure-bf16`` step runs
the model cast to bfloat16 (:mod:`memflow.graph.compute`); an ``amp`` step runs it with fp32
weights under float16 autocast. Its saved tensors, temporaries and memory traffic are those of
that program, which capture records in a second pass (:data:`PASS`: ``graph.bf16``,
``graph.amp``): each tensor in the dtype its op makes — bf16 or fp16 mostly, fp32 where the
model upcasts (Llama's RMSNorm, a softmax in fp32, the loss) or autocast runs in fp32 (its fp32
list: norms, losses, ``exp``…) — and the copies the casts make (under ``amp``, autocast's half
copy of each weight, made once per step); and buffers at the width the cast gives them (batch
norms' statistics in bf16).

A graph without the bf16 pass (built by hand) halves instead under a bf16 precision: every
float32 tensor, temporary and byte moved at 2 bytes, integer tensors (token ids, masks) and
units captured in half precision unchanged. That under-counts a model that upcasts. Without
the amp pass ``amp`` keeps the capture's own sizes, as ``fp32`` does: right for a graph
captured under autocast (its own ``amp`` program: it records which ops ran in half
precision), not for an fp32 one, on which export refuses ``amp``
(:func:`memflow.strategy.runnable.amp_problem`) — halving would miss autocast's weight copies
and fp32 ops all the same.

Which units compute in bfloat16 (:func:`bf16_units`) matters to time: a GPU without bf16
units (``bf16`` false in the cluster's devices, as on a V100) runs them at its FP32 rate.
"""
from __future__ import annotations

import weakref
from dataclasses import replace

import numpy as np

from ..memory.arrays import GraphArrays, graph_arrays
from ..memory.states import WIDTHS

__all__ = ["activation_arrays", "ACTIVATION_WIDTH", "BF16_PRECISIONS", "PASS", "bf16_units"]

ACTIVATION_WIDTH = {p: w for p, (w, _, _) in WIDTHS.items() if w is not None}
"""precision -> bytes per floating-point activation element, where the precision casts."""
BF16_PRECISIONS = tuple(ACTIVATION_WIDTH)
"""The precisions that compute in bfloat16: those that cast (export casts to bfloat16,
:func:`memflow.export.model_states.compute_dtype`)."""
PASS = {"bf16": "bf16", "pure-bf16": "bf16", "amp": "amp"}
"""precision -> the graph's second pass (:data:`memflow.graph.opgraph.PASSES`) that runs it."""
_FP32 = {"float32", "torch.float32", "float"}
_BF16 = {"bfloat16", "torch.bfloat16"}
_CACHE: "weakref.WeakKeyDictionary[object, dict]" = weakref.WeakKeyDictionary()


def activation_arrays(graph, precision: str | None) -> GraphArrays:
    """The graph's arrays with activations at ``precision``'s width (cached per graph).

    >>> import pandas as pd
    >>> from memflow.graph import OpGraph
    >>> g = OpGraph(pd.DataFrame({"fwd_flops": [1.0], "bwd_flops": [2.0],
    ...                           "fwd_tmp_bytes": [40.0]}, index=["fc"]),
    ...             pd.DataFrame({"bytes": [8, 400], "producer": ["<input>", "fc"],
    ...                           "consumers": [["fc"], []], "dtype": ["int64", "float32"]}))
    >>> activation_arrays(g, "bf16").bytes.tolist(), activation_arrays(g, "bf16").fwd_tmp.tolist()
    ([8.0, 200.0], [20.0])
    >>> activation_arrays(g, "amp") is graph_arrays(g)     # no amp pass: the capture's sizes
    True
    """
    ga = graph_arrays(graph)
    key = PASS.get(precision or "fp32")
    if key is None:
        return ga
    run = getattr(graph, key, None)
    if run is not None:                                 # the program as the precision runs it
        return graph_arrays(run)
    if key == "amp":
        return ga
    per_graph = _CACHE.setdefault(graph, {})
    hit = per_graph.get(precision)
    if hit is None or hit[0] is not ga:
        dtype = graph.tensors["dtype"].astype(str) if "dtype" in graph.tensors.columns else None
        fp32 = (np.zeros(len(ga.bytes), bool) if dtype is None
                else dtype.isin(_FP32).to_numpy())
        width = ACTIVATION_WIDTH[precision]     # a bf16 precision's (WIDTHS), amp returned above
        unit = np.where(ga.half, 1.0, width / 4)       # fp32 units' temporaries and traffic
        hit = per_graph[precision] = (ga, replace(
            ga, bytes=np.where(fp32, ga.bytes * width / 4, ga.bytes),
            fwd_tmp=ga.fwd_tmp * unit, bwd_tmp=ga.bwd_tmp * unit, cached=ga.cached * unit,
            unpack_tmp=np.where(ga.unpack_tmp < 0, -1.0, ga.unpack_tmp * unit),
            unpack_done=ga.unpack_done * unit,
            fwd_bytes_moved=ga.fwd_bytes_moved * unit, bwd_bytes_moved=ga.bwd_bytes_moved * unit,
            expensive_fwd_bytes_moved=ga.expensive_fwd_bytes_moved * unit))
    return hit[1]


def bf16_units(graph, precision: str | None) -> np.ndarray:
    """Per unit, whether it computes in bfloat16: every unit under a bf16 precision
    (:data:`BF16_PRECISIONS`), else the units captured in bfloat16 (autocast to bfloat16, or
    a bf16 model). Cached per graph; do not write into the result.

    >>> import pandas as pd
    >>> from memflow.graph import OpGraph
    >>> g = OpGraph(pd.DataFrame({"fwd_flops": [1.0, 1.0], "bwd_flops": [2.0, 2.0],
    ...                           "dtype": ["bfloat16", "float16"]},
    ...                          index=["a", "b"]),
    ...             pd.DataFrame({"bytes": [8], "producer": ["<input>"], "consumers": [["a"]]}))
    >>> bf16_units(g, "amp").tolist(), bf16_units(g, "pure-bf16").tolist()
    ([True, False], [True, True])
    """
    ga = graph_arrays(graph)
    per_graph = _CACHE.setdefault(graph, {})
    key = ("bf16 units", precision in BF16_PRECISIONS)
    hit = per_graph.get(key)
    if hit is None or hit[0] is not ga:
        mask = (np.ones(ga.n, bool) if key[1]
                else graph.units["dtype"].astype(str).isin(_BF16).to_numpy())
        hit = per_graph[key] = (ga, mask)
    return hit[1]
