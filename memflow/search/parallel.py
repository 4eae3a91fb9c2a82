"""Several chains at once, in local processes or on a Dask cluster, sharing their best.

The chains run in rounds. In each round every chain continues from its saved state for its
share of the budget; between rounds the coordinator finds the best strategy of all chains and
offers it to every chain that has not done as well (:meth:`MCMCSearch.offer`: the chain adopts
it and goes on from there). Everything crosses process boundaries as JSON-ready dicts — the
graph, the cluster, the chain states, the strategies — never pickled model objects, so a Dask
worker on another machine needs only memflow installed.

Locally the chains run in a ``spawn`` process pool (safe with threads and CUDA, and the same
on every OS); with ``client=`` a ``dask.distributed.Client``, or ``scheduler=`` the address of
a running ``dask.distributed`` scheduler (``"tcp://host:8786"``), they are Dask tasks: the
problem (graph, cluster, options) is scattered to the workers once, and each round sends only
the chains' states. One chain without Dask runs in this process.

The ``rounds`` table records, per chain and round, whether the chain adopted the best of all
chains at the start of that round (``adopted``): the exchange can be checked, not assumed.
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
    rounds: pd.DataFrame       # round, chain, iterations, best_cost, adopted, wall (s)
    history: pd.DataFrame                # every chain's history, with a ``chain`` column
    states: list[dict] = field(repr=False, default_factory=list)

    def search(self, chain: int, graph, cluster) -> MCMCSearch:
        """Chain ``chain`` as an :class:`MCMCSearch`, to continue it in this process."""
        return MCMCSearch.from_dict(self.states[chain], graph, cluster,
                                    source=f"chain {chain}")


def _objects(problem: dict) -> tuple[Any, Any]:
    from ..graph import OpGraph
    from ..hardware import Cluster
    key = problem["key"]
    if key not in _WORKER_CACHE:
        _WORKER_CACHE.clear()       # one problem at a time per worker
        _WORKER_CACHE[key] = (OpGraph.from_dict(problem["graph"]),
                              Cluster.from_dict(problem["cluster"]))
    return _WORKER_CACHE[key]


def _round(payload: dict, problem: dict) -> dict:
    """One round of one chain (runs in a worker): resume, adopt the offer, run, report the
    state and whether the offer was adopted."""
    graph, cluster = _objects(problem)
    if payload["state"] is None:
        options = dict(problem["options"])
        if isinstance(options.get("init"), dict):
            options["init"] = Strategy.from_dict(options["init"])
        search = MCMCSearch(graph, cluster, seed=payload["seed"], **options)
    else:
        search = MCMCSearch.from_dict(payload["state"], graph, cluster,
                                      source=f"chain {payload['chain']}")
    adopted = payload["offer"] is not None and search.offer(Strategy.from_dict(payload["offer"]))
    search.run(iterations=payload["iterations"], seconds=payload["seconds"])
    return {"state": search.to_dict(), "adopted": bool(adopted)}


def _strip_history(doc: dict) -> tuple[dict, dict]:
    """The state without its history rows (kept by the coordinator) and those rows."""
    rows = doc["history"]
    empty = History(rows["devices"]).to_dict()
    return {**doc, "history": empty}, rows


def run_chains(graph, cluster, *, chains: int = 4, seconds: float | None = None,
               iterations: int | None = None, rounds: int | None = None, client: Any = None,
               scheduler: str | None = None, seed: int = 0, share: bool = True,
               **options: Any) -> ChainsResult:
    """Run ``chains`` MCMC chains for ``seconds`` (wall time, split into rounds) or
    ``iterations`` (per chain), sharing the best strategy between rounds when ``share``.

    ``options`` go to :class:`MCMCSearch` (``memory_limit``, ``init``, ``beta`` …; a
    ``Strategy`` init is sent as JSON). Chain ``k`` draws its seed from
    ``numpy.random.SeedSequence(seed)``, so the run is reproducible for a fixed number of
    iterations. ``client``: a ``dask.distributed.Client`` to run the rounds on; ``scheduler``:
    the address of a ``dask.distributed`` scheduler to connect to instead (the client is closed
    at the end).

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
    if client is not None and scheduler is not None:
        raise SearchError("run_chains takes client= or scheduler=, not both")
    problem = {"key": graph_fingerprint(graph) + cluster_fingerprint(cluster),
               "graph": graph.to_dict(), "cluster": cluster.to_dict(), "options": options}
    submit, close = _runner(chains, client, scheduler, problem)
    states: list[dict | None] = [None] * chains
    histories: list[list[dict]] = [[] for _ in range(chains)]
    table, t0, winner = [], time.perf_counter(), -1
    try:
        for r in range(rounds):
            its = None if iterations is None else \
                iterations * (r + 1) // rounds - iterations * r // rounds
            secs = None if seconds is None else max(0.0, t0 + seconds * (r + 1) / rounds
                                                    - time.perf_counter())
            payloads = [{"chain": k, "seed": seeds[k], "state": states[k],
                         "offer": _offer(states, winner, k) if share else None,
                         "iterations": its, "seconds": secs} for k in range(chains)]
            done = submit(payloads)
            for k, out in enumerate(done):
                doc = out["state"]
                states[k], rows = _strip_history(doc)
                histories[k].append(rows)
                table.append({"round": r, "chain": k, "iterations": doc["chain"]["iteration"],
                              "best_cost": _best_cost(doc), "adopted": out["adopted"],
                              "wall": time.perf_counter() - t0})
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


def _runner(chains: int, client: Any, scheduler: str | None, problem: dict):
    """``(submit(payloads) -> results, close())`` for Dask, a process pool, or in-process."""
    if scheduler is not None:
        from dask.distributed import Client    # optional: only a Dask run needs it
        try:
            client = Client(scheduler)    # waits distributed.comm.timeouts.connect
        except OSError as exc:
            raise SearchError(f"no dask.distributed scheduler answers at {scheduler!r} "
                              f"({exc}); give the address a running scheduler prints, "
                              "e.g. 'tcp://127.0.0.1:8786'") from exc
        submit, _ = _runner(chains, client, None, problem)
        return submit, client.close
    if client is not None:
        # held by the cluster once, not sent with every round (a list: a dict would be split);
        # each worker fetches it when its first round needs it. Not broadcast: the scheduler's
        # replication of a large problem lost the key ("Key lost during replication") and
        # cancelled every round on 2 and on 4 local workers (bench_dask, 2026-11-28)
        shared = client.scatter([problem])[0]

        def submit(payloads):
            return client.gather([client.submit(_round, p, shared, pure=False)
                                  for p in payloads])
        return submit, lambda: client.cancel(shared)
    if chains == 1:
        return (lambda payloads: [_round(p, problem) for p in payloads]), lambda: None
    pool = ProcessPoolExecutor(max_workers=chains,
                               mp_context=multiprocessing.get_context("spawn"))
    return (lambda payloads: list(pool.map(_round, payloads, [problem] * len(payloads)))), \
        pool.shutdown
