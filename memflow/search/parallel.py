"""Several chains at once, in local processes or on a Dask cluster, sharing their best.

The chains run in rounds. In each round every chain continues from its saved state for its
share of the budget; between rounds the coordinator finds the best strategy of all chains and
offers it to every chain that has not done as well (:meth:`MCMCSearch.offer`: the chain adopts
it and goes on from there). Everything crosses process boundaries as JSON-ready dicts — the
graph, the cluster, the chain states, the strategies — never pickled model objects, so a Dask
worker on another machine needs only memflow installed.

Locally the chains run in a ``spawn`` process pool (safe with threads and CUDA, and the same
on every OS); with ``client=`` a ``dask.distributed.Client`` they are Dask tasks. One chain
without a client runs in this process.
"""
from __future__ import annotations

import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ..errors import SearchError
from ..strategy import Strategy
from .cost import Score
from .history import History
from .mcmc import MCMCSearch
from .persist import cluster_fingerprint, graph_fingerprint

__all__ = ["run_chains", "ChainsResult"]

_WORKER_CACHE: dict[str, Any] = {}     # per worker process: graphs and clusters by fingerprint


@dataclass
class ChainsResult:
    """The best strategy over all chains, and what each chain did round by round."""

    best: Strategy
    best_cost: float
    best_score: Score
    rounds: pd.DataFrame                 # round, chain, iterations, best_cost, wall (s)
    history: pd.DataFrame                # every chain's history, with a ``chain`` column
    states: list[dict] = field(repr=False, default_factory=list)

    def search(self, chain: int, graph, cluster) -> MCMCSearch:
        """Chain ``chain`` as an :class:`MCMCSearch`, to continue it in this process."""
        return MCMCSearch.from_dict(self.states[chain], graph, cluster,
                                    source=f"chain {chain}")


def _objects(payload: dict) -> tuple[Any, Any]:
    from ..graph import OpGraph
    from ..hardware import Cluster
    key = payload["key"]
    if key not in _WORKER_CACHE:
        _WORKER_CACHE.clear()       # one problem at a time per worker
        _WORKER_CACHE[key] = (OpGraph.from_dict(payload["graph"]),
                              Cluster.from_dict(payload["cluster"]))
    return _WORKER_CACHE[key]


def _round(payload: dict) -> dict:
    """One round of one chain (runs in a worker): resume, adopt the offer, run, report."""
    graph, cluster = _objects(payload)
    if payload["state"] is None:
        options = dict(payload["options"])
        if isinstance(options.get("init"), dict):
            options["init"] = Strategy.from_dict(options["init"])
        search = MCMCSearch(graph, cluster, seed=payload["seed"], **options)
    else:
        search = MCMCSearch.from_dict(payload["state"], graph, cluster,
                                      source=f"chain {payload['chain']}")
    if payload["offer"] is not None:
        search.offer(Strategy.from_dict(payload["offer"]))
    search.run(iterations=payload["iterations"], seconds=payload["seconds"])
    return search.to_dict()


def _strip_history(doc: dict) -> tuple[dict, dict]:
    """The state without its history rows (kept by the coordinator) and those rows."""
    rows = doc["history"]
    empty = History(rows["devices"]).to_dict()
    return {**doc, "history": empty}, rows


def run_chains(graph, cluster, *, chains: int = 4, seconds: float | None = None,
               iterations: int | None = None, rounds: int | None = None, client: Any = None,
               seed: int = 0, share: bool = True, **options: Any) -> ChainsResult:
    """Run ``chains`` MCMC chains for ``seconds`` (wall time, split into rounds) or
    ``iterations`` (per chain), sharing the best strategy between rounds when ``share``.

    ``options`` go to :class:`MCMCSearch` (``memory_limit``, ``init``, ``beta`` …; a
    ``Strategy`` init is sent as JSON). Chain ``k`` draws its seed from
    ``numpy.random.SeedSequence(seed)``, so the run is reproducible for a fixed number of
    iterations. ``client``: a ``dask.distributed.Client`` to run the rounds on.

    >>> import memflow
    >>> from memflow.search.synthetic import chain_graph
    >>> g = chain_graph(6, batch=4096, width=256)
    >>> res = run_chains(g, memflow.Cluster.preset("1xV100-16GB"), chains=1, iterations=60,
    ...                  rounds=2, memory_limit=85e6)
    >>> res.rounds[["round", "chain", "iterations"]].values.tolist()
    [[0, 0, 30], [1, 0, 60]]
    """
    if chains < 1:
        raise SearchError(f"chains must be >= 1, got {chains}")
    if (seconds is None) == (iterations is None):
        raise SearchError("run_chains needs exactly one budget: seconds= (wall time) or "
                          "iterations= (per chain)")
    rounds = int(rounds or (4 if iterations is None else max(1, min(4, iterations // 50))))
    if isinstance(options.get("init"), Strategy):
        options = {**options, "init": options["init"].to_dict()}
    seeds = [int(s.generate_state(1)[0]) for s in np.random.SeedSequence(seed).spawn(chains)]
    base = {"key": graph_fingerprint(graph) + cluster_fingerprint(cluster),
            "graph": graph.to_dict(), "cluster": cluster.to_dict(), "options": options}
    submit, close = _runner(chains, client)
    states: list[dict | None] = [None] * chains
    histories: list[list[dict]] = [[] for _ in range(chains)]
    table, t0, winner = [], time.perf_counter(), -1
    try:
        for r in range(rounds):
            its = None if iterations is None else \
                iterations * (r + 1) // rounds - iterations * r // rounds
            secs = None if seconds is None else max(0.0, t0 + seconds * (r + 1) / rounds
                                                    - time.perf_counter())
            payloads = [{**base, "chain": k, "seed": seeds[k], "state": states[k],
                         "offer": _offer(states, winner, k) if share else None,
                         "iterations": its, "seconds": secs} for k in range(chains)]
            done = submit(payloads)
            for k, doc in enumerate(done):
                states[k], rows = _strip_history(doc)
                histories[k].append(rows)
                chain = doc["chain"]
                table.append({"round": r, "chain": k, "iterations": chain["iteration"],
                              "best_cost": _best_cost(doc), "wall": time.perf_counter() - t0})
            winner = min(range(chains), key=lambda k: (_best_cost(states[k]), k))
    finally:
        close()
    win = states[winner]
    history = pd.concat([_frame(histories[k], k) for k in range(chains)], ignore_index=True)
    for k in range(chains):      # hand back complete, resumable chains
        states[k]["history"] = _merge(histories[k])
    return ChainsResult(Strategy.from_dict(win["chain"]["best"]), _best_cost(win),
                        Score.from_dict(win["chain"]["best_score"]), pd.DataFrame(table),
                        history, states)


def _offer(states: list, winner: int, k: int) -> dict | None:
    """The winning chain's best, for chain ``k`` if it did worse (None in the first round)."""
    if winner < 0 or k == winner or _best_cost(states[k]) <= _best_cost(states[winner]):
        return None
    return states[winner]["chain"]["best"]


def _best_cost(doc: dict) -> float:
    chain = doc["chain"]
    if chain["memory_aware"] and not chain["seen_feasible"]:
        return float("inf")
    return float(chain["best_score"]["cost"])


def _merge(parts: list[dict]) -> dict:
    out = {k: [] for k in parts[0] if k != "devices"}
    for p in parts:
        for k in out:
            out[k] += p[k]
    return {**out, "devices": parts[0]["devices"]}


def _frame(parts: list[dict], chain: int) -> pd.DataFrame:
    df = History.from_dict(_merge(parts)).frame.reset_index(drop=True)
    df.insert(0, "chain", chain)
    return df


def _runner(chains: int, client: Any):
    """``(submit(payloads) -> results, close())`` for Dask, a process pool, or in-process."""
    if client is not None:
        def submit(payloads):
            return client.gather([client.submit(_round, p, pure=False) for p in payloads])
        return submit, lambda: None
    if chains == 1:
        return (lambda payloads: [_round(p) for p in payloads]), lambda: None
    pool = ProcessPoolExecutor(max_workers=chains,
                               mp_context=multiprocessing.get_context("spawn"))
    return (lambda payloads: list(pool.map(_round, payloads))), pool.shutdown
