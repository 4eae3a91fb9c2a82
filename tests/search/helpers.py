"""Shared set-up of the search tests: small heterogeneous chains and their exact optima."""
from __future__ import annotations

from functools import lru_cache

import numpy as np

import memflow
from memflow.search import exhaustive
from memflow.search.synthetic import chain_graph, mlp_chain

V100 = memflow.Cluster.preset("1xV100-16GB")
FOUR = memflow.Cluster.preset("4xV100-16GB")


@lru_cache(maxsize=None)
def chain(n: int, seed: int = 0, activation: str = "gelu", batch: int = 16384, width: int = 64):
    """A chain whose activations dominate its weights, so checkpointing matters; activation
    ``"mlp"``: :func:`~memflow.search.synthetic.mlp_chain` (16× MLP blocks between narrow
    projections), where schedules reach down to about a third of keep-all on 10 units."""
    if activation == "mlp":
        return mlp_chain(n, seed=seed)
    return chain_graph(n, batch=batch, width=width, seed=seed, activation=activation)


@lru_cache(maxsize=None)
def every_schedule(n: int, seed: int = 0, activation: str = "gelu"):
    """Time and peak of all 2^n keep/recompute schedules of ``chain(n, seed)`` on one V100."""
    return exhaustive(chain(n, seed, activation), V100, max_strategies=1 << 12).table


def optimum(table, limit: float) -> float:
    """Least time of the schedules in ``table`` that fit ``limit`` (inf if none)."""
    fits = table["peak"].to_numpy() <= limit
    return float(np.min(table["time"].to_numpy()[fits], initial=np.inf))


def keep_all_peak(table) -> float:
    """Peak of the keep-everything schedule (the table's first row)."""
    return float(table["peak"].iloc[0])
