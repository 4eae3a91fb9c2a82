"""The strategies an MCMC search simulates, on a ResNet-50 of leaf units on 8 GPUs and a
Llama of blocks on 64 GPUs from tensor × pipeline parallelism, give to the bit the figures
frozen in ``searched.json`` (every record, block, copy, task, start, end and peak; written by
the numpy code that the compiled passes of a placement replaced), on the search's own
simulator (its caches carried over) and on a fresh one (issue 15: compiled placement passes).

``python tests/sim/test_searched_strategies.py --write`` freezes the figures anew (after a
deliberate change of the memory or time model: say which in the commit).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest

import memflow
from memflow.search import MCMCSearch
from memflow.sim import Simulator

PATH = Path(__file__).resolve().parent / "searched.json"
PROPOSALS = 200      # per case: the strategies simulated are those the search did not remember
LLAMA = dict(vocab=40, hidden=16, n_layer=4, n_head=4, n_kv_head=2, ffn=24, seq_len=6)


@functools.lru_cache(maxsize=None)
def _case(name: str) -> tuple:
    """The graph, cluster and search settings of case ``name``."""
    if name == "resnet50-leaves-8gpu":
        g = memflow.zoo.graph("resnet50", batch_size=16, image_size=32)
        return g, memflow.Cluster.preset("8xV100-32GB"), {"memory_limit": 40e6}
    g = memflow.zoo.graph("tinyllama-1.1b", batch_size=64, units="blocks", **LLAMA)
    c64 = memflow.Cluster.build("A100-80GB", 8, 8)
    start = memflow.Strategy.tensor_parallel(g, c64, tp=4, pp=2, dp=8, microbatches=4)
    return g, c64, {"init": start, "optimizer": "adam"}


def _digest(*arrays) -> str:
    h = hashlib.blake2b(digest_size=8)
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _arrays(x) -> list[np.ndarray]:
    """Every array of ``x`` (a dataclass, tuple or array), depth first in field order."""
    if isinstance(x, np.ndarray):
        return [x]
    if isinstance(x, (tuple, list)):
        return [a for y in x for a in _arrays(y)]
    if dataclasses.is_dataclass(x):
        return [a for f in dataclasses.fields(x) for a in _arrays(getattr(x, f.name))]
    return []


def figures(run) -> dict[str, str]:
    """A digest of each part of ``run``: the placement's records, structure and block
    table's rows, the memory plan's blocks, the tasks, the timeline and the peaks."""
    P, b = run.placement, run.blocks
    return {
        "records": _digest(*_arrays(P.placed)),
        "structure": _digest(*_arrays(P.structure)),
        "table": _digest(*(P.blocks.static[k] for k in sorted(P.blocks.static)),
                         P.blocks.persistent, *vars(P.blocks.states).values()),
        "blocks": _digest(*(b.rows[k] for k in sorted(b.rows)), b.offloaded, b.compressed,
                          b.persistent, b.segment, b.segment_start),
        "tasks": _digest(*(getattr(run.tasks, k) for k in ("kind", "unit", "mb", "duration",
                                                          "channel_set", "dep_ptr",
                                                          "dep_idx"))),
        "timeline": _digest(run.start, run.end, np.float64(run.iteration_time)),
        "peaks": _digest(run.device.peak[run.device_class], run.host.peak, *P.sets,
                         *P.raw_sets),
    }


def searched(name: str) -> tuple[list, list[dict]]:
    """The strategies a seeded search of case ``name`` simulates, and what its own
    simulator gave for each."""
    g, cluster, settings = _case(name)
    search = MCMCSearch(g, cluster, seed=0, **settings)
    own = search.simulator.run
    seen, got = [], []

    def run(strategy, **kw):
        out = own(strategy, **kw)
        seen.append(strategy)
        got.append(figures(out))
        return out

    search.simulator.run = run
    search.step(PROPOSALS)
    return seen, got


@pytest.mark.parametrize("name", ["resnet50-leaves-8gpu", "llama-blocks-64gpu"])
def test_searched_strategies_give_the_frozen_figures_kept_and_fresh(name):
    want = json.loads(PATH.read_text())[name]
    strategies, kept = searched(name)
    assert len(strategies) == len(want) > PROPOSALS // 2
    g, cluster, settings = _case(name)
    for i, (s, k, w) in enumerate(zip(strategies, kept, want)):
        fresh = Simulator(g, cluster, optimizer=settings.get("optimizer", "sgd"))
        fresh = figures(fresh.run(s))
        assert k == w, (i, [f for f in w if k[f] != w[f]])
        assert fresh == w, (i, [f for f in w if fresh[f] != w[f]])


if __name__ == "__main__" and "--write" in sys.argv:
    PATH.write_text(json.dumps({n: searched(n)[1] for n in ("resnet50-leaves-8gpu",
                                                             "llama-blocks-64gpu")},
                               indent=0) + "\n")
