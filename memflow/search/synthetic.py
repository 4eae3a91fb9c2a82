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

__all__ = ["chain_graph", "chain_widths", "mlp_chain"]

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
                batch: int = 64, seed: int | None = 0, activation: str = "gelu",
                expansion: int | Sequence[int] = 0) -> OpGraph:
    """A chain of ``n`` dense layers ``l0 … l{n-1}`` as an :class:`~memflow.graph.OpGraph`.

    Layer ``i`` reads ``x[i]`` (``batch × w[i-1]`` floats, the input for ``l0``), saves it for
    its weight gradient, and produces ``x[i+1]`` (``batch × w[i]``). With ``"relu"`` the
    activation saves its output (the next layer's input, so two layers hold it); with
    ``"gelu"`` it saves its input, an internal tensor only this layer holds.

    ``expansion=k`` (or one ``k`` per layer, 0 for a dense layer) makes a unit a transformer
    MLP block instead, ``Linear(w[i-1], k·w[i])
    → GELU → Linear(k·w[i], w[i])``: it saves its input and two hidden tensors ``k`` times
    wider than its output, so most of its memory is internal and recomputing the block alone
    (holding only its narrow input) saves most of it.

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
    ex = [int(expansion)] * n if isinstance(expansion, (int, float)) else list(expansion)
    if len(ex) != n or min(ex) < 0:
        raise SearchError(f"expansion={ex} must be one integer >= 0 or {n} of them")
    f4 = 4
    params, fwd, moved, fwd_tmp, bwd_tmp = [], [], [], [], []
    for a, b, k in zip(fan_in, w, ex):
        if k:   # fc1: a×h, fc2: h×b; saved: the input, GELU's input and fc2's input
            h = k * b
            params.append(a * h + h + h * b + b)
            fwd.append(2.0 * batch * (a * h + h * b) + 8.0 * batch * h)
            moved.append(f4 * (batch * a + a * h + h * b + 4 * batch * h + batch * b))
            fwd_tmp.append(0)
            bwd_tmp.append(f4 * batch * h)
        else:
            params.append(a * b + b)
            fwd.append(2.0 * batch * a * b + batch * b)
            moved.append(f4 * (batch * a + a * b + 3 * batch * b))
            fwd_tmp.append(f4 * batch * b if activation == "relu" else 0)
            bwd_tmp.append(f4 * batch * b)
    units = pd.DataFrame({
        "module": [f"layers.{i}" for i in range(n)],
        "kind": ["MLPBlock" if k else "Dense" for k in ex],
        "params": params, "fwd_flops": fwd, "bwd_flops": [2.0 * f for f in fwd],
        "fwd_bytes_moved": moved, "bwd_bytes_moved": [2 * m for m in moved],
        "fwd_ops": 3, "bwd_ops": 5, "fwd_tmp_bytes": fwd_tmp, "bwd_tmp_bytes": bwd_tmp,
        "max_parameter_degree": w, "max_attribute_degree": 1,
    }, index=pd.Index(names, name="unit"))
    units["param_bytes"] = units["params"] * f4
    units["trainable_bytes"] = units["param_bytes"]
    rows = []
    for i in range(n):
        prev = INPUT if i == 0 else names[i - 1]
        shared = activation == "relu" and not ex[i] and i > 0
        rows.append(dict(bytes=f4 * batch * fan_in[i], producer=prev, consumers=[names[i]],
                         savers=[names[i - 1], names[i]] if shared else [names[i]],
                         is_output=False, requires_grad=i > 0, shape=(batch, fan_in[i])))
        inner = [ex[i] * w[i]] * 2 if ex[i] else [w[i]] if activation == "gelu" else []
        for size in inner:
            rows.append(dict(bytes=f4 * batch * size, producer=names[i], consumers=[],
                             savers=[names[i]], is_output=False, requires_grad=True,
                             shape=(batch, size)))
    rows.append(dict(bytes=f4 * batch * w[-1], producer=names[-1], consumers=[],
                     savers=[names[-1]] if activation == "relu" and not ex[-1] else [],
                     is_output=True, requires_grad=True, shape=(batch, w[-1])))
    return OpGraph(units, pd.DataFrame(rows),
                   {"model": f"chain{n}", "batch_size": batch, "backend": "cuda",
                    "units": "blocks"})


def mlp_chain(n: int = 10, *, seed: int | None = 0, batch: int = 2048, width: int = 64,
              expansion: int = 16, projection: int = 16) -> OpGraph:
    """A chain of transformer-style MLP blocks (even units) between narrow dense projections
    (odd units), whose activations dominate its weights.

    Block ``i`` widens its input ``expansion`` times inside (``Linear → GELU → Linear``) and
    outputs about ``width`` features (log-uniform within ±0.2 octave, so blocks differ a
    little); a projection outputs about ``projection`` (±1 octave). Nearly all of the memory is
    inside the blocks, so recomputing each block alone while the cheap projections between
    them stay kept holds little more than the blocks' inputs: the floor of any schedule is one
    block's backward (its rebuilt tensors, gradient and workspace), about a third of
    keeping everything on 10 units and a quarter on 14. The search's comparison against the
    optimum uses it for limits down to 30% of keep-all.

    >>> g = mlp_chain(4, batch=8)
    >>> g.units["kind"].tolist(), g.units["saved_bytes"].tolist()
    (['MLPBlock', 'Dense', 'MLPBlock', 'Dense'], [74240, 3072, 66304, 2304])
    """
    if n < 1:
        raise SearchError(f"a chain needs n >= 1, got n={n}")
    rng = random.Random(seed)
    widths, ex = [], []
    for i in range(n):
        block = i % 2 == 0
        w, spread = (width, 0.2) if block else (projection, 1.0)
        if seed is not None:
            w = w * 2 ** rng.uniform(-spread, spread)
        widths.append(max(8, round(w / 8) * 8))
        ex.append(int(expansion) if block else 0)
    return chain_graph(n, widths=widths, width=projection, batch=batch, expansion=ex)
