"""Synthetic chains for the search's tests, doctests and benchmarks (no capture, no torch).

:func:`chain_graph` builds the OpGraph that capturing ``memflow.zoo`` model ``"chain"`` with
``units="blocks"`` gives in spirit: ``n`` dense layers ``Linear(w[i-1], w[i]) → activation``
in a line, with heterogeneous widths so that the layers' costs and activation sizes differ (the
case where optimal checkpointing beats evenly spaced checkpoints). It is built directly from
the formulas, so the search can be tested while capture is elsewhere.
"""
from __future__ import annotations

import random
from typing import Sequence

import pandas as pd

from ..errors import SearchError
from ..graph import INPUT, OpGraph

__all__ = ["chain_graph", "chain_widths"]

ACTIVATIONS = ("relu", "gelu")


def chain_widths(n: int, width: int = 1024, seed: int | None = 0) -> list[int]:
    """``n`` layer widths drawn log-uniformly in ``[width/4, 4·width]``, multiples of 8.

    >>> chain_widths(4, 64, seed=1)
    [24, 168, 136, 32]
    """
    if n < 1 or width < 1:
        raise SearchError(f"a chain needs n >= 1 and width >= 1, got n={n}, width={width}")
    if seed is None:
        return [width] * n
    rng = random.Random(seed)
    return [max(8, round(width * 2 ** rng.uniform(-2, 2) / 8) * 8) for _ in range(n)]


def chain_graph(n: int = 10, *, widths: Sequence[int] | None = None, width: int = 1024,
                batch: int = 64, seed: int | None = 0, activation: str = "gelu") -> OpGraph:
    """A chain of ``n`` dense layers ``l0 … l{n-1}`` as an :class:`~memflow.graph.OpGraph`.

    Layer ``i`` reads ``x[i]`` (``batch × w[i-1]`` floats, the input for ``l0``), saves it for
    its weight gradient, and produces ``x[i+1]`` (``batch × w[i]``). With ``"relu"`` the
    activation saves its output (the next layer's input, so two layers hold it); with
    ``"gelu"`` it saves its input, an internal tensor only this layer holds.

    >>> g = chain_graph(3, widths=(8, 32, 4), width=16, batch=2)
    >>> g.names, g.units["saved_bytes"].tolist()
    (['l0', 'l1', 'l2'], [192, 320, 288])
    """
    if activation not in ACTIVATIONS:
        raise SearchError(f"activation={activation!r} is unknown; valid: {', '.join(ACTIVATIONS)}")
    w = list(widths) if widths is not None else chain_widths(n, width, seed)
    if len(w) != n or min(w) < 1:
        raise SearchError(f"widths={w} must be {n} positive integers (one per layer)")
    names = [f"l{i}" for i in range(n)]
    fan_in = [width] + w[:-1]
    f4 = 4
    units = pd.DataFrame({
        "module": [f"layers.{i}" for i in range(n)], "kind": "Dense",
        "params": [a * b + b for a, b in zip(fan_in, w)],
        "fwd_flops": [2.0 * batch * a * b + batch * b for a, b in zip(fan_in, w)],
        "bwd_flops": [4.0 * batch * a * b + batch * b for a, b in zip(fan_in, w)],
        "fwd_bytes_moved": [f4 * (batch * a + a * b + 3 * batch * b) for a, b in zip(fan_in, w)],
        "bwd_bytes_moved": [f4 * (2 * batch * a + 2 * a * b + 4 * batch * b)
                            for a, b in zip(fan_in, w)],
        "fwd_ops": 3, "bwd_ops": 5,
        "fwd_tmp_bytes": [f4 * batch * b if activation == "relu" else 0 for b in w],
        "bwd_tmp_bytes": [f4 * batch * b for b in w],
        "max_parameter_degree": w, "max_attribute_degree": 1,
    }, index=pd.Index(names, name="unit"))
    units["param_bytes"] = units["params"] * f4
    units["trainable_bytes"] = units["param_bytes"]
    rows = []
    for i in range(n):
        prev = INPUT if i == 0 else names[i - 1]
        savers = [names[i]] if (i == 0 or activation == "gelu") else [names[i - 1], names[i]]
        rows.append(dict(bytes=f4 * batch * fan_in[i], producer=prev, consumers=[names[i]],
                         savers=savers, is_output=False, requires_grad=i > 0,
                         shape=(batch, fan_in[i])))
        if activation == "gelu":
            rows.append(dict(bytes=f4 * batch * w[i], producer=names[i], consumers=[],
                             savers=[names[i]], is_output=False, requires_grad=True,
                             shape=(batch, w[i])))
    rows.append(dict(bytes=f4 * batch * w[-1], producer=names[-1], consumers=[],
                     savers=[names[-1]] if activation == "relu" else [], is_output=True,
                     requires_grad=True, shape=(batch, w[-1])))
    return OpGraph(units, pd.DataFrame(rows),
                   {"model": f"chain{n}", "batch_size": batch, "backend": "cuda",
                    "units": "blocks"})
