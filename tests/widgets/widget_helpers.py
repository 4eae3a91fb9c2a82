"""Helpers of the headless widget tests: a small real graph and asyncio waiting."""
from __future__ import annotations

import asyncio
import time
from typing import Callable

import pandas as pd

from memflow.graph import OpGraph


def chain_graph(n: int = 10, unit_bytes: int = 1024) -> OpGraph:
    """A chain of ``n`` linear units, unit i saving (i+1) × ``unit_bytes`` for a batch of 8: a
    real OpGraph, made without capture."""
    names = [f"layer{i}" for i in range(n)]
    units = pd.DataFrame({"fwd_flops": [1e9] * n, "bwd_flops": [2e9] * n, "kind": ["Linear"] * n,
                          "params": [1000] * n, "param_bytes": [4000] * n,
                          "trainable_bytes": [4000] * n}, index=names)
    tensors = pd.DataFrame({
        "bytes": [unit_bytes * (i + 1) for i in range(n + 1)],
        "producer": ["<input>"] + names,
        "consumers": [[u] for u in names] + [[]],
        "savers": [[u] for u in names] + [[]],
        "is_output": [False] * n + [True]})
    return OpGraph(units, tensors, {"model": "hand-built chain", "batch_size": 8})


def run(coro):
    """Run a coroutine on a fresh event loop (the kernel's loop in a notebook)."""
    return asyncio.run(coro)


async def until(predicate: Callable[[], bool], timeout: float = 20.0) -> None:
    """Yield to the loop until ``predicate()`` holds; fail after ``timeout`` seconds."""
    end = time.perf_counter() + timeout
    while not predicate():
        if time.perf_counter() > end:
            raise AssertionError(f"condition not reached within {timeout} s")
        await asyncio.sleep(0.005)


class Recording:
    """A real search seen through a recorder: every ``step`` is made one proposal at a time and
    the current strategy after each is kept in :attr:`strategies`, so that tests can check pins
    in every strategy the chain stood on. With ``fail_at``, stepping past that iteration raises
    (a search that breaks mid-run). Everything else is the search's own."""

    def __init__(self, search, *, fail_at: int | None = None):
        self.search = search
        self.fail_at = fail_at
        self.strategies: list = []

    def __getattr__(self, name):
        return getattr(self.search, name)

    def step(self, n: int = 1):
        for _ in range(n):
            if self.fail_at is not None and self.search.iteration >= self.fail_at:
                raise RuntimeError(f"search stopped on purpose at iteration {self.fail_at}")
            self.search.step(1)
            self.strategies.append(self.search.current)
        return self
