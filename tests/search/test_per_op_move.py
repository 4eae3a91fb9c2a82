"""The per-op move: on a graph of leaf units the search proposes the per-operation planner's
keep/selective choices, takes those that lower the cost, and a saved search resumes the same."""
from __future__ import annotations

import functools

import torch
from torch import nn

import memflow
from memflow.search import MCMCSearch
from memflow.search.moves import DEFAULT_WEIGHTS

from .helpers import V100

LIMIT = 11.8e6      # keeping everything peaks above it (12.35 MB), some selective plans below


@functools.cache
def leaf_mlp():
    """Three Linear + GELU + LayerNorm blocks, a unit per op (capture's leaf units)."""
    torch.manual_seed(0)
    block = lambda: nn.Sequential(nn.Linear(256, 256), nn.GELU(), nn.LayerNorm(256))  # noqa: E731
    return memflow.from_torch(nn.Sequential(*(block() for _ in range(3))), torch.randn(1024, 256))


def test_proposed_by_default_and_accepted_when_it_lowers_the_cost():
    g = leaf_mlp()
    assert DEFAULT_WEIGHTS["per_op"] > 0
    assert "per_op" in set(MCMCSearch(g, V100, memory_limit=LIMIT, seed=1).step(60)
                           .history["move"])
    search = MCMCSearch(g, V100, memory_limit=LIMIT, moves={"per_op": 1.0}, seed=0)
    start = search.current_cost
    h = search.step(20).history
    current = h["cost"].where(h["accepted"]).ffill().shift(fill_value=start)
    lower = h[(h["move"] == "per_op") & (h["cost"] < current)]
    assert len(lower) and lower["accepted"].all()
    assert search.best_cost < start and "selective" in search.best.policies
    assert search.best_result.feasible


def test_a_saved_search_resumes_the_same_chain(tmp_path):
    g = leaf_mlp()
    straight = MCMCSearch(g, V100, memory_limit=LIMIT, moves={"per_op": 1.0}, seed=3).step(24)
    first = MCMCSearch(g, V100, memory_limit=LIMIT, moves={"per_op": 1.0}, seed=3).step(12)
    again = MCMCSearch.load(first.save(tmp_path / "s.json"), g, V100).step(12)
    cols = ["move", "unit", "cost", "accepted"]
    assert again.history[cols].equals(straight.history[cols])
    assert again.best == straight.best and again.current == straight.current
