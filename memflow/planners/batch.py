"""A captured graph at another batch size, without capturing again.

Planners that weigh batch sizes (hybrid parallelism's global batch, the batch that compression
frees room for) need the graph at many batches; capturing a large model takes seconds to
minutes each time. ``at_batch`` scales a graph linearly instead, with these rules:

* FLOPs and temporaries scale with the batch; launches do not;
* bytes moved: the weight traffic (parameters and buffers read in forward; read, and gradients
  written, in backward) stays, the rest scales;
* activation storages marked ``per_sample`` scale (and the batch dimension of their shape);
  others, such as a causal mask, do not; parameters never do;
* the second passes (``graph.bf16``, ``graph.amp``) scale by the same rules.

This is exact for models whose every per-sample cost is linear in the batch (convolutions,
linear layers, LSTMs and attention at a fixed sequence length) and an approximation where a
kernel's traffic is not; capture the model at the batch itself when that matters (planners
that take a graph at several batches also accept a function ``batch -> OpGraph``).

>>> import pandas as pd
>>> from memflow.graph import OpGraph
>>> units = pd.DataFrame({"fwd_flops": [8e9], "bwd_flops": [16e9], "param_bytes": [400],
...                       "fwd_bytes_moved": [1400]}, index=["fc"])
>>> tensors = pd.DataFrame({"bytes": [800, 80], "producer": ["<input>", "fc"],
...     "consumers": [["fc"], []], "savers": [["fc"], []], "is_output": [False, True],
...     "shape": [[8, 25], [8, 2]]})
>>> g2 = at_batch(OpGraph(units, tensors, {"batch_size": 8}), 16)
>>> g2.units.loc["fc", ["fwd_flops", "fwd_bytes_moved", "saved_bytes"]].tolist()
[16000000000.0, 2400.0, 1600.0]
>>> g2.tensors["shape"].tolist(), g2.meta["batch_size"]
([[16, 25], [16, 2]], 16)
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..errors import PlanError
from ..graph import OpGraph

__all__ = ["at_batch", "graph_source"]


def at_batch(graph: OpGraph, batch_size: int) -> OpGraph:
    """``graph`` scaled linearly from its batch size to ``batch_size`` (see the module)."""
    if not isinstance(graph, OpGraph):
        raise PlanError(f"at_batch: graph must be a memflow OpGraph, got {type(graph).__name__}")
    old = graph.meta.get("batch_size")
    if not isinstance(old, (int, np.integer)) or old < 1:
        raise PlanError(f"at_batch: graph.meta['batch_size'] must be a positive integer, got "
                        f"{old!r}")
    if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise PlanError(f"at_batch: batch_size must be a positive integer, got {batch_size!r}")
    if batch_size == old:
        return graph
    k = batch_size / old
    u = graph.units.drop(columns=["input_bytes", "output_bytes", "saved_bytes"]).copy()
    for col in ("fwd_flops", "bwd_flops"):
        u[col] = u[col] * k
    for col in ("fwd_tmp_bytes", "bwd_tmp_bytes"):
        u[col] = (u[col] * k).round().astype(np.int64)
    weights = (u["param_bytes"] + u["buffer_bytes"]).astype(np.float64)
    for col, w in (("fwd_bytes_moved", weights), ("bwd_bytes_moved", weights + u["param_bytes"])):
        fixed = np.minimum(u[col], w)
        u[col] = (fixed + (u[col] - fixed) * k).round().astype(np.int64)
    t = graph.tensors.drop(columns=["first_saver", "last_consumer"]).copy()
    per = t["per_sample"].to_numpy(bool)
    t.loc[per, "bytes"] = (t.loc[per, "bytes"] * k).round().astype(np.int64)
    t["shape"] = [_scaled_shape(s, old, batch_size) if p else list(s)
                  for s, p in zip(t["shape"], per)]
    # model states do not scale with the batch: the parameters table carries over whole
    return OpGraph(u, t, {**graph.meta, "batch_size": int(batch_size)},
                   parameters=graph.parameters,
                   **{key: at_batch(other, batch_size) for key, other in graph.passes().items()})


def _scaled_shape(shape: list[int], old: int, new: int) -> list[int]:
    shape = list(shape)
    for i, d in enumerate(shape):
        if d == old:               # the first dimension equal to the batch is the batch
            shape[i] = new
            break
    return shape


def graph_source(graph: OpGraph | Callable[[int], OpGraph]) -> Callable[[int], OpGraph]:
    """A function ``batch -> OpGraph``: ``graph`` itself if it is one, else ``at_batch``."""
    if callable(graph) and not isinstance(graph, OpGraph):
        return graph
    if not isinstance(graph, OpGraph):
        raise PlanError(f"expected an OpGraph or a function batch -> OpGraph, got "
                        f"{type(graph).__name__}")
    cache: dict[int, OpGraph] = {}

    def source(batch: int) -> Any:
        if batch not in cache:
            cache[batch] = at_batch(graph, batch)
        return cache[batch]

    return source
