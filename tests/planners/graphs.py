"""Small hand-made graphs for the planners' tests (no capture, so they build instantly)."""
from __future__ import annotations

import pandas as pd

from memflow.graph import OpGraph

GIB = 2 ** 30


def chain(n: int = 6, *, saved=None, flops: float = 1e12, params: float = 0.0,
          kinds=None, batch: int = 8, model: str = "chain") -> OpGraph:
    """Units u0..u{n-1} in a line: u_i reads (and saves) the output of u_{i-1} (the input for
    u0); the last output is the model's. ``saved[i]`` bytes per link (1 GiB each by default);
    backward costs twice the forward; activation gradients are left out (inputs need none)."""
    saved = [GIB] * n if saved is None else list(saved)
    names = [f"u{i}" for i in range(n)]
    units = pd.DataFrame({"fwd_flops": [flops] * n, "bwd_flops": [2 * flops] * n,
                          "param_bytes": [params] * n, "trainable_bytes": [params] * n,
                          "kind": kinds or ["Linear"] * n}, index=names)
    tensors = pd.DataFrame({
        "bytes": saved + [8],
        "producer": ["<input>"] + names,
        "consumers": [[u] for u in names] + [[]],
        "savers": [[u] for u in names] + [[]],
        "is_output": [False] * n + [True],
        "requires_grad": False})
    return OpGraph(units, tensors, {"batch_size": batch, "model": model})
