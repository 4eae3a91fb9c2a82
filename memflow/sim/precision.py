"""What a strategy's precision does to its activations: a ``bf16`` or ``pure-bf16`` step runs
the model cast to bfloat16 (:mod:`memflow.graph.compute`), so its saved tensors, temporaries
and memory traffic are those of that program, which capture records in a second pass
(``graph.bf16``): each tensor in the dtype its op makes — bf16 mostly, fp32 where the model
upcasts (Llama's RMSNorm, a softmax in fp32, the loss) — and the copies the casts make; and
buffers at the width the cast gives them (batch norms' statistics in bf16).

A graph without that pass (built by hand, or captured under autocast) halves instead: every
float32 tensor, temporary and byte moved at 2 bytes, integer tensors (token ids, masks) and
units captured in half precision unchanged. That under-counts a model that upcasts.

The precisions that cast activations are those whose weights are half width in
:data:`memflow.memory.states.WIDTHS`; ``fp32`` and ``amp`` keep the capture's own sizes (an
``amp`` capture under autocast already records which ops ran in half precision).

Which units compute in bfloat16 (:func:`bf16_units`) matters to time: a GPU without bf16
units (``bf16`` false in the cluster's devices, as on a V100) runs them at its FP32 rate.
"""
from __future__ import annotations

import weakref
from dataclasses import replace

import numpy as np

from ..memory.arrays import GraphArrays, graph_arrays
from ..memory.states import WIDTHS

__all__ = ["activation_arrays", "ACTIVATION_WIDTH", "BF16_PRECISIONS", "bf16_units"]

ACTIVATION_WIDTH = {p: w for p, (w, _, _) in WIDTHS.items() if w is not None}
"""precision -> bytes per floating-point activation element, where the precision casts."""
BF16_PRECISIONS = tuple(ACTIVATION_WIDTH)
"""The precisions that compute in bfloat16: those that cast (export casts to bfloat16,
:func:`memflow.export.model_states.compute_dtype`)."""
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
    >>> activation_arrays(g, "amp") is graph_arrays(g)
    True
    """
    ga = graph_arrays(graph)
    width = ACTIVATION_WIDTH.get(precision or "fp32")
    if width is None:
        return ga
    if getattr(graph, "bf16", None) is not None:       # the program as it runs in bf16
        return graph_arrays(graph.bf16)
    per_graph = _CACHE.setdefault(graph, {})
    hit = per_graph.get(precision)
    if hit is None or hit[0] is not ga:
        dtype = graph.tensors["dtype"].astype(str) if "dtype" in graph.tensors.columns else None
        fp32 = (np.zeros(len(ga.bytes), bool) if dtype is None
                else dtype.isin(_FP32).to_numpy())
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
