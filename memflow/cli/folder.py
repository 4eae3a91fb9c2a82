"""A plan folder: the search run with a progress bar, and the files it leaves.

``plan/`` holds

* ``strategy.json`` — the best strategy (:meth:`memflow.Strategy.to_json`);
* ``search.json`` — the search, graph and cluster embedded (:meth:`memflow.MCMCSearch.save`),
  so that ``memflow report plan/`` needs neither the model nor a new capture;
* ``history.csv`` — one row per proposal (:attr:`memflow.MCMCSearch.history`);
* ``summary.json`` — what was asked (model, batch, cluster …) and what was found.

>>> import tempfile, memflow
>>> g = memflow.zoo.graph("chain", batch_size=8, n=3, width=16, units="blocks")
>>> search = run_search(g, memflow.Cluster.preset("2xV100-16GB"), iterations=20, progress=False)
>>> out = write_plan(tempfile.mkdtemp(), search, {"model": "chain", "batch": 8})
>>> sorted(p.name for p in out.iterdir())
['history.csv', 'search.json', 'strategy.json', 'summary.json']
"""
from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any, Mapping

from .._jsonio import write_json, write_text

__all__ = ["run_search", "write_plan", "summarize", "FILES"]

FILES = {"strategy": "strategy.json", "search": "search.json", "history": "history.csv",
         "summary": "summary.json"}
CHUNK_SECONDS = 0.25   # progress bar refreshes about this often


def _postfix(search) -> dict[str, str]:
    best = search.best_score
    return {"best": f"{best.time * 1e3:,.1f} ms" if math.isfinite(search.best_cost) else "-",
            "feasible": "yes" if best.feasible else "no",
            "accept": f"{search.acceptance_rate():.0%}"}


def run_search(graph, cluster, *, iterations: int | None = None, seconds: float | None = None,
               seed: int = 0, progress: bool = True, **settings: Any):
    """Run an :class:`~memflow.MCMCSearch` for ``iterations`` proposals or ``seconds``
    (60 s when neither is given), showing a tqdm bar with the best time, whether it fits and
    the acceptance rate. ``settings`` go to the search (``optimizer``, ``beta`` …)."""
    from tqdm import tqdm

    from ..search import MCMCSearch

    if iterations is None and seconds is None:
        seconds = 60.0
    search = MCMCSearch(graph, cluster, seed=seed, **settings)
    by_count = iterations is not None
    total = int(iterations) if by_count else float(seconds)
    bar = tqdm(total=total, disable=not progress, unit=" proposals" if by_count else " s",
               bar_format=None if by_count else "{l_bar}{bar}| {n:.0f}/{total:.0f} s{postfix}",
               desc="search", dynamic_ncols=True)
    start = time.perf_counter()
    done = 0
    with bar:
        # Chunks of steps sized to ~CHUNK_SECONDS keep the bar live without a thread.
        chunk = 1
        while True:
            elapsed = time.perf_counter() - start
            left = (total - done) if by_count else (total - elapsed)
            if left <= 0:
                break
            t0 = time.perf_counter()
            n = min(chunk, int(left)) if by_count else chunk
            search.step(max(n, 1))
            done += max(n, 1)
            took = time.perf_counter() - t0
            chunk = max(1, int(chunk * CHUNK_SECONDS / took)) if took > 0 else chunk * 2
            bar.set_postfix(_postfix(search), refresh=False)
            bar.update(max(n, 1) if by_count else min(time.perf_counter() - start, total) - bar.n)
    return search


def summarize(search, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """``summary.json``'s content: the inputs, then the best strategy's time, peaks, fit."""
    best = search.best_score
    devices = [str(d) for d in search.cluster.devices.index]
    return {"format": "memflow.planners/1", **dict(inputs),
            "cluster_name": search.cluster.name,
            "iterations": int(search.iteration), "search_seconds": float(search.elapsed),
            "simulations": int(search.simulations),
            "acceptance_rate": float(search.acceptance_rate(None)),
            "best_time": float(best.time), "feasible": bool(best.feasible),
            "start_time": float(search.history["time"].iloc[0]) if search.iteration else None,
            "start_feasible": bool(search.history["feasible"].iloc[0]) if search.iteration
            else None,
            "peak": dict(zip(devices, (float(p) for p in best.peak))),
            "capacity": {d: float(m) for d, m in search.cluster.devices["memory_bytes"].items()},
            "files": dict(FILES)}


def write_plan(out: str | os.PathLike, search, inputs: Mapping[str, Any]) -> Path:
    """Write the plan folder ``out`` (see the module docstring) and return it."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    # The chain's strategies keep the starting strategy's name; say what this one is.
    best = search.best
    best.with_schedule(name=f"memflow search: best of {search.iteration:,} proposals "
                            f"from {best.name}").to_json(out / FILES["strategy"])
    search.save(out / FILES["search"], embed=True)
    # CSV is for people and spreadsheets; written atomically, like the JSON files.
    write_text(out / FILES["history"], search.history.to_csv(index=False))
    write_json(out / FILES["summary"], summarize(search, inputs))
    return out
