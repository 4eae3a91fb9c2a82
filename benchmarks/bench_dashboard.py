"""Does the dashboard slow the search down? Proposals per CPU second, bare vs through the dashboard.

For each case the same search (same graph, cluster and seed, so the same proposals) runs the
same number of iterations twice: bare, ``search.step(N)`` in one call; and through a
:class:`memflow_widgets.SearchDashboard` — its runner's asyncio chunks, with every view
attached: a point of progress streamed into the acceptance and cost charts every 0.2 s, the
counters, and the best strategy's memory chart redrawn as it improves (within its 2% budget,
and once more when the run ends). Headless (no browser): the widget messages are built and
handed to a comm that has no kernel behind it.

Measured for a loaded shared machine, where one run alone swings by tens of percent:

- rates are proposals per second of the process's CPU time (what the dashboard costs, whatever
  else the machine runs; wall rates are given beside);
- the two runs of a pair run at the same time, in two processes that make their search (and
  dashboard) first and start their measured parts together, so that the machine's other work
  falls on both; each pair gives a ratio of CPU rates, and the median ratio, with its
  interquartile range and extremes, is what the dashboard keeps. (Each run also competes with
  its twin: the dashboard's cadences are wall time — 30 ms chunks, a flush every 0.2 s — so
  they fall on fewer CPU seconds than with one run alone, a bias against the dashboard);
- what was made before a run is frozen out of the garbage collector (``gc.freeze``): a full
  collection of resnet50's heap (~0.3 s) otherwise fell into a run or not by where the heap's
  size left the collector's counts, and made single runs 12% slower or not;
- runs are sized to about ``--seconds`` of CPU each (from a bare probe run), so that what a run
  pays once — the first redraw of the memory chart and the one when it stops — weighs as in a
  session of some seconds, not as in a blink;
- as a cross-check that does not depend on two runs being alike, each dashboard run also
  counts the CPU time spent outside the search's steps: the dashboard's own share, and 1 − that
  share is what it keeps in the same run.

Responsiveness: the progress points drawn per second of wall time while running, the longest
wall gap between two of them, and the memory chart's redraws. The load average (1 min) is read
before and after each case. Target: the dashboard keeps at least 90% of the bare CPU rate.

    python benchmarks/bench_dashboard.py [--quick] [--pairs K] [--seconds S]
                                         [--cases chain12 resnet50] [--no-write]
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))

import memflow  # noqa: E402
from memflow.search.synthetic import chain_graph  # noqa: E402
from memflow_widgets import SearchDashboard  # noqa: E402

from _results import table, write_section  # noqa: E402  (benchmarks/ is on the path)

TARGET = 0.90


def timed(run) -> tuple[float, float]:
    """(CPU seconds of this process, wall seconds) that ``run()`` took."""
    cpu, wall = time.process_time(), time.perf_counter()
    run()
    return time.process_time() - cpu, time.perf_counter() - wall


class StepClock:
    """The search, with the CPU time spent inside its ``step`` counted (the rest of a dashboard
    run is the dashboard's own cost)."""

    def __init__(self, search):
        self.search = search
        self.cpu = 0.0

    def __getattr__(self, name):
        return getattr(self.search, name)

    def step(self, n: int = 1):
        t0 = time.process_time()
        self.search.step(n)
        self.cpu += time.process_time() - t0
        return self


def bare(make, iterations: int):
    """``iterations`` steps made in one ``step`` call; returns the run, which returns its CPU
    and wall seconds (the search is made before, so that the run measures its steps only)."""
    search = make()

    def run() -> dict:
        cpu, wall = timed(lambda: search.step(iterations))
        return {"cpu": cpu, "wall": wall}
    return run


def through_dashboard(make, iterations: int):
    """The same steps run by the dashboard's runner with its views attached; returns the run
    (the dashboard is made before), which returns its CPU and wall seconds, the CPU seconds
    inside the search's steps, the progress flushes while running (their count and longest
    gap, wall seconds) and the memory chart's redraws."""
    search = StepClock(make())
    dash = SearchDashboard(search, max_iterations=iterations)
    flushes: list[float] = []
    redraws = []
    drawn = [dash._drawn]

    def heard(runner) -> None:      # told after the dashboard's own listeners
        if runner.state == "running":
            flushes.append(time.perf_counter())
        if dash._drawn is not drawn[-1]:
            drawn.append(dash._drawn)
            redraws.append(runner.steps)
    dash.runner.add_listener(heard)

    async def go() -> None:
        dash.runner.start()
        state = await dash.runner.wait()
        assert state == "done", (state, dash.runner.error)

    def run() -> dict:
        cpu, wall = timed(lambda: asyncio.run(go()))
        assert search.iteration == iterations and dash.runner.error is None
        gaps = [b - a for a, b in zip(flushes, flushes[1:])]
        return {"cpu": cpu, "wall": wall, "in steps": search.cpu, "flushes": len(flushes),
                "max gap": max(gaps, default=float("nan")), "redraws": len(redraws)}
    return run


def chain_case():
    chain = chain_graph(12, batch=4096, width=256)
    two = memflow.Cluster.preset("2xV100-16GB")
    return lambda: memflow.MCMCSearch(chain, two, memory_limit=85e6, seed=0)


def resnet_case():
    resnet = memflow.zoo.graph("resnet50", batch_size=256)
    eight = memflow.Cluster.preset("8xV100-16GB")
    return lambda: memflow.MCMCSearch(resnet, eight, seed=0)


# name: (title, the case's search factory, iterations of the probe run that sizes the runs)
CASES = {"chain12": ("chain of 12 units, 2×V100 (fast proposals)", chain_case, 1000),
         "resnet50": ("resnet50, batch 256, 8×V100", resnet_case, 500)}
RUNS = {"bare": bare, "dashboard": through_dashboard}


def child(run: str, case: str, iterations: int) -> None:
    """One run in a process of its own: build the case and the run (the search, and the
    dashboard), say ``ready``, wait for ``go`` on stdin (so that the measured parts of both runs
    of a pair start together), run, print the figures as JSON."""
    make = CASES[case][1]()
    make().step(20)                           # imports and first simulations out of the way
    go = RUNS[run](make, iterations)
    # What was made before the run (the graph, torch, the dashboard's widgets) is frozen out
    # of the collector's reach: else a full collection, ~0.3 s on resnet50's heap, falls into
    # a run or not depending on where the heap's size left the collector's counts — it fell
    # into the bare runs and not the dashboard's (a bigger heap) in 700-step runs, 12% of them
    gc.collect()
    gc.freeze()
    print("ready", flush=True)
    sys.stdin.readline()
    print(json.dumps(go()), flush=True)


def pair(case: str, iterations: int) -> tuple[dict, dict]:
    """The bare and the dashboard run of ``case``, at the same time in two processes."""
    procs = {run: subprocess.Popen([sys.executable, __file__, "--child", run, case,
                                    str(iterations)], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True) for run in RUNS}
    for p in procs.values():
        while (line := p.stdout.readline()) and line.strip() != "ready":
            pass
        assert line, f"a {case} run ended before it was ready"
    for p in procs.values():
        p.stdin.write("go\n")
        p.stdin.flush()
    out = {}
    for run, p in procs.items():
        lines = p.stdout.read().strip().splitlines()
        assert p.wait() == 0 and lines, f"the {run} run of {case} failed"
        out[run] = json.loads(lines[-1])
    return out["bare"], out["dashboard"]


def quartiles(values: list[float]) -> tuple[float, float, float]:
    """(lower quartile, median, upper quartile)."""
    if len(values) < 2:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def measure(case: str, pairs: int, seconds: float) -> dict:
    """``pairs`` pairs of runs of about ``seconds`` CPU seconds each, bare and through the
    dashboard, the two runs of a pair at the same time; the ratio of each pair's CPU rates,
    its median and spread, and the same-run cross-check."""
    name, make_case, probe = CASES[case]
    load0 = os.getloadavg()[0]
    make = make_case()
    make().step(20)
    cpu = bare(make, probe)()["cpu"]          # sizes the runs
    iterations = max(probe, int(round(seconds * probe / cpu, -2)))
    ratios, share, runs = [], [], []
    rates: dict[str, list[float]] = {"bare cpu": [], "dash cpu": [], "bare wall": [],
                                     "dash wall": []}
    for _ in range(pairs):
        b, d = pair(case, iterations)
        runs.append(d)
        share.append(1 - d["in steps"] / d["cpu"])
        ratios.append(b["cpu"] / d["cpu"])
        for key, secs in (("bare cpu", b["cpu"]), ("dash cpu", d["cpu"]),
                          ("bare wall", b["wall"]), ("dash wall", d["wall"])):
            rates[key].append(iterations / secs)
    load1 = os.getloadavg()[0]
    med = {k: statistics.median(v) for k, v in rates.items()}
    q1, kept, q3 = quartiles(ratios)
    overhead = statistics.median(share)
    direct = 1 - overhead
    per_s = statistics.median(r["flushes"] / r["wall"] for r in runs)
    max_gap = max(r["max gap"] for r in runs)
    redraws = statistics.median(r["redraws"] for r in runs)
    print(f"{name}: {iterations} iterations; CPU {med['bare cpu']:,.0f} -> "
          f"{med['dash cpu']:,.0f}/s, kept {kept:.1%} (IQR {q1:.1%}–{q3:.1%}, pairs "
          f"{min(ratios):.1%}–{max(ratios):.1%}); wall {med['bare wall']:,.0f} -> "
          f"{med['dash wall']:,.0f}/s; dashboard's own share of CPU {overhead:.1%} "
          f"(keeps {direct:.1%} in the same run; runs {min(share):.1%}–{max(share):.1%}); "
          f"{per_s:.1f} progress points/s, longest gap {max_gap:.2f} s, {redraws:g} memory "
          f"redraws; load {load0:.1f} -> {load1:.1f}; pairs: "
          f"{' '.join(f'{r:.1%}' for r in ratios)}", flush=True)
    return {"case": name, "iterations": iterations, "pairs": pairs,
            "bare (per CPU s)": med["bare cpu"], "dashboard (per CPU s)": med["dash cpu"],
            "kept (median of pairs)": f"{kept:.1%}", "pairs' IQR": f"{q1:.1%}–{q3:.1%}",
            "pairs' range": f"{min(ratios):.1%}–{max(ratios):.1%}",
            "dashboard's own CPU share": f"{overhead:.1%}", "kept (same run)": f"{direct:.1%}",
            "bare (per wall s)": med["bare wall"], "dashboard (per wall s)": med["dash wall"],
            "progress points per s": per_s, "longest gap (s)": max_gap,
            "memory redraws": redraws, "load (1 min)": f"{load0:.1f} → {load1:.1f}",
            "meets 90%": "yes" if min(kept, direct) >= TARGET else
                         "same run only" if direct >= TARGET else "NO"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small runs, no results file")
    ap.add_argument("--no-write", action="store_true", help="print only, no results file")
    ap.add_argument("--pairs", type=int, default=7, help="pairs of runs per case")
    ap.add_argument("--seconds", type=float, default=4.0,
                    help="CPU seconds of each run (sized from a bare probe run)")
    ap.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    ap.add_argument("--child", nargs=3, metavar=("RUN", "CASE", "ITERATIONS"),
                    help=argparse.SUPPRESS)     # one run of a pair (see pair)
    args = ap.parse_args()
    if args.child:
        run, case, iterations = args.child
        child(run, case, int(iterations))
        return
    pairs, seconds = (1, 0.5) if args.quick else (args.pairs, args.seconds)
    cases = ["chain12"] if args.quick else args.cases
    rows = [measure(case, pairs, seconds) for case in cases]
    df = pd.DataFrame(rows).set_index("case")
    print(table(df))
    if not (args.quick or args.no_write):
        write_section("dashboard", table(df) + (
            f"\n\n{pairs} pairs of runs per case, each pair's bare and dashboard runs at the "
            "same time in two processes (so that the machine's other work falls on both), "
            f"each run sized to about {seconds:g} s of CPU from a bare probe run; proposals "
            "per second of each process's CPU time (medians; the pairs' interquartile range "
            "and extremes show how much single pairs moved) and of wall time. The dashboard's "
            "own share is the CPU time of the dashboard runs spent outside the search's steps "
            "(a same-run cross-check). The dashboard streams a point of progress into its "
            "charts every 0.2 s (less often when a flush would take more than 3% of the time) "
            "and redraws the best strategy's memory chart as it improves (at most every second "
            "and, after the first, within 2% of the time, on a budget of its own), and once "
            "more when the run ends; progress points per second and the longest gap between "
            "two of them are wall time while running. Target: keep at least 90% of the bare "
            "search's proposals per CPU second."),
            title="Dashboard overhead: proposals per second with and without the live views")

if __name__ == "__main__":
    main()
