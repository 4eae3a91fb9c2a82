"""Multi-chain search on Dask: proposals per second with 1, 2 and 4 workers (issue 15, item 4).

One problem — resnet50 b=512 at depth 2 (one unit per bottleneck) on ``8xV100-32GB`` with a
4 GB limit per GPU, from data parallelism (which does not fit) — searched by
:func:`memflow.search.run_chains` with one chain per worker:

* in this process, one chain, no Dask (the reference rate);
* on a ``dask.distributed.LocalCluster`` of 1, 2 and 4 worker processes (one thread each),
  through a ``Client`` of it;
* on the same 2-worker cluster reached by its scheduler's TCP address (``scheduler=``), the
  code path of a remote cluster;
* in this process again, last: the spread between the two in-process rows is the noise of
  the machine's load over the run.

Between rounds the best strategy of all chains is offered to every chain that did worse;
``adopted`` counts the chains that took it (the exchange happens, it is not assumed).
Proposals per second are all chains' proposals over the run's wall time (rounds, transfers and
the coordinator's bookkeeping included), then per worker; ``start_s`` is the time a first,
tiny run took before (workers importing memflow and building the problem), kept out of the
rate.

Run: ``python benchmarks/bench_dask.py [--seconds 60] [--rounds 6]`` (``--quick``: 10 s, 2
rounds, nothing written).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import memflow  # noqa: E402
from memflow.search import run_chains  # noqa: E402
from _results import table, write_section  # noqa: E402

CLUSTER, LIMIT = "8xV100-32GB", "4GB"


def measure(label: str, workers: int, g, c, seconds: float, rounds: int, **where) -> dict:
    t0 = time.perf_counter()
    # a cold worker first imports memflow and builds the problem (tens of seconds under load):
    # timed apart, so that the rate is the chains' own
    run_chains(g, c, chains=workers, iterations=workers, rounds=1, memory_limit=LIMIT, **where)
    start = time.perf_counter() - t0
    t0 = time.perf_counter()
    res = run_chains(g, c, chains=workers, seconds=seconds, rounds=rounds, memory_limit=LIMIT,
                     seed=0, **where)
    wall = time.perf_counter() - t0
    last = res.rounds[res.rounds["round"] == res.rounds["round"].max()]
    total = int(last["iterations"].sum())
    row = {"run": label, "workers": workers, "start_s": start, "proposals": total,
           "wall_s": wall,
           "proposals/s": total / wall, "per worker/s": total / wall / workers,
           "adopted": int(res.rounds["adopted"].sum()), "best_ms": res.best_cost * 1e3,
           "load": os.getloadavg()[0]}
    print(row)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="wall time of each run")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    seconds, rounds = (10.0, 2) if args.quick else (args.seconds, args.rounds)
    from dask.distributed import Client, LocalCluster
    g = memflow.zoo.graph("resnet50", batch_size=512, units=2)
    c = memflow.Cluster.preset(CLUSTER)
    load = os.getloadavg()[0]
    rows = [measure("in process, no Dask", 1, g, c, seconds, rounds)]
    for workers in (1, 2, 4):
        with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                          dashboard_address=None) as lc:
            with Client(lc) as client:
                rows.append(measure("LocalCluster, Client", workers, g, c, seconds, rounds,
                                    client=client))
            if workers == 2:
                rows.append(measure(f"scheduler= {lc.scheduler_address.split(':')[0]}://…",
                                    workers, g, c, seconds, rounds,
                                    scheduler=lc.scheduler_address))
    # the same run as the first, last: how far the machine's load moves the rates meanwhile
    rows.append(measure("in process, no Dask (again)", 1, g, c, seconds, rounds))
    df = pd.DataFrame(rows)
    print(df.to_string(index=False))
    if args.quick:
        return
    body = (f"resnet50 b=512 at depth 2 ({len(g)} units) on {CLUSTER} with a {LIMIT} limit "
            f"per GPU, from data parallel; one chain per worker, {seconds:.0f} s of wall time "
            f"in {rounds} rounds per run, the best shared between rounds. **This machine has "
            f"{os.cpu_count()} cores shared with other jobs (load average {load:.1f} at the "
            "start; `load`: the 1-minute load average at the end of each run)**: beyond 2 "
            "workers the chains share cores, so the total cannot scale; per worker it shows "
            "what each chain gets; the two in-process rows (first and last) show "
            "how much the load, and this process's caches warmed by the runs before, move a rate "
            "(each cluster's workers start cold). `start_s`: a first tiny run on fresh workers "
            "(imports, the problem built), not in the rate. `adopted`: chain-rounds that took the "
            "best of all chains; `best_ms`: the best feasible step time found.\n\n"
            + table(df, ".4g"))
    write_section("search_dask", body, title="Multi-chain search on Dask (issue 15)")


if __name__ == "__main__":
    main()
