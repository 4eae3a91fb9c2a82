"""Does the dashboard slow the search down? Proposals per CPU second, bare vs through the dashboard.

For each case the same search (same graph, cluster and seed, so the same proposals) runs the
same number of iterations twice: bare, ``search.step(N)`` in one call; and through a
:class:`memflow_widgets.SearchDashboard` — its runner's asyncio chunks, with every view
attached: a point of progress streamed into the acceptance and cost charts every 0.2 s, the
counters, and the best strategy's memory chart redrawn as it improves (within its 2% budget,
and once more when the run ends). Headless (no browser): the widget messages are built and
handed to a comm that has no kernel behind it.

Measured for a loaded shared machine: rates are proposals per second of this process's CPU
time (what the dashboard costs, whatever else the machine runs; wall rates are given beside).
Runs are sized to about ``--seconds`` of CPU each (from a bare probe run), so that what a run
pays once — the final redraw when it stops — weighs as in a session of some seconds, not as in
a blink. Runs come in pairs, one bare and one through the dashboard, in alternating order
(bare first, then dashboard first, ...), so that a change of load falls on both sides; each
pair gives a ratio of CPU rates, and the median ratio, with its interquartile range and
extremes, is what the dashboard keeps. As a cross-check that does not depend on two runs being
alike, each dashboard run also counts the CPU time spent outside the search's steps: the
dashboard's own share, and 1 − that share is what it keeps in the same run. Responsiveness:
the progress points drawn per second of wall time while running, the longest wall gap between
two of them, and the memory chart's redraws. The load average (1 min) is read before and
after each case. Target: the dashboard keeps at least 90% of the bare CPU rate.

    python benchmarks/bench_dashboard.py [--quick] [--pairs K] [--seconds S] [--no-write]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
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


def bare(make, iterations: int) -> tuple[float, float]:
    """``iterations`` steps made in one ``step`` call."""
    search = make()
    return timed(lambda: search.step(iterations))


def through_dashboard(make, iterations: int) -> dict:
    """The same steps run by the dashboard's runner with its views attached: CPU and wall
    seconds, the CPU seconds inside the search's steps, the progress flushes while running
    (their count and longest gap, wall seconds) and the memory chart's redraws."""
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

    cpu, wall = timed(lambda: asyncio.run(go()))
    assert search.iteration == iterations and dash.runner.error is None
    gaps = [b - a for a, b in zip(flushes, flushes[1:])]
    return {"cpu": cpu, "wall": wall, "in steps": search.cpu, "flushes": len(flushes),
            "max gap": max(gaps, default=float("nan")), "redraws": len(redraws)}


def quartiles(values: list[float]) -> tuple[float, float, float]:
    """(lower quartile, median, upper quartile)."""
    if len(values) < 2:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def measure(name: str, make, probe: int, pairs: int, seconds: float) -> dict:
    """``pairs`` pairs of runs of about ``seconds`` CPU seconds each, bare and through the
    dashboard, the order alternating; the ratio of each pair's CPU rates, its median and
    spread (robust to other processes slowing one run), and the same-run cross-check."""
    load0 = os.getloadavg()[0]
    make().step(20)                           # imports and first simulations out of the way
    cpu, _ = bare(make, probe)                # sizes the runs
    iterations = max(probe, int(round(seconds * probe / cpu, -2)))
    ratios, share, runs = [], [], []
    rates: dict[str, list[float]] = {"bare cpu": [], "dash cpu": [], "bare wall": [],
                                     "dash wall": []}
    for k in range(pairs):
        for which in (("bare", "dash") if k % 2 == 0 else ("dash", "bare")):
            if which == "bare":
                cpu_b, wall_b = bare(make, iterations)
            else:
                d = through_dashboard(make, iterations)
                runs.append(d)
                share.append(1 - d["in steps"] / d["cpu"])
        ratios.append(cpu_b / d["cpu"])
        for key, secs in (("bare cpu", cpu_b), ("dash cpu", d["cpu"]), ("bare wall", wall_b),
                          ("dash wall", d["wall"])):
            rates[key].append(iterations / secs)
    load1 = os.getloadavg()[0]
    med = {k: statistics.median(v) for k, v in rates.items()}
    q1, kept, q3 = quartiles(ratios)
    overhead = statistics.median(share)
    direct = 1 - overhead
    per_s = statistics.median(r["flushes"] / (r["wall"]) for r in runs)
    max_gap = max(r["max gap"] for r in runs)
    redraws = statistics.median(r["redraws"] for r in runs)
    print(f"{name}: {iterations} iterations; CPU {med['bare cpu']:,.0f} -> "
          f"{med['dash cpu']:,.0f}/s, kept {kept:.1%} (IQR {q1:.1%}–{q3:.1%}, pairs "
          f"{min(ratios):.1%}–{max(ratios):.1%}); wall {med['bare wall']:,.0f} -> "
          f"{med['dash wall']:,.0f}/s; dashboard's own share of CPU {overhead:.1%} "
          f"(keeps {direct:.1%} in the same run); {per_s:.1f} progress points/s, longest gap "
          f"{max_gap:.2f} s, {redraws:g} memory redraws; load {load0:.1f} -> {load1:.1f}",
          flush=True)
    return {"case": name, "iterations": iterations, "pairs": pairs,
            "bare (per CPU s)": med["bare cpu"], "dashboard (per CPU s)": med["dash cpu"],
            "kept (median of pairs)": f"{kept:.1%}",
            "pairs' IQR": f"{q1:.1%}–{q3:.1%}", "pairs' range": f"{min(ratios):.1%}–{max(ratios):.1%}",
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
    args = ap.parse_args()
    ap.add_argument("--pairs", type=int, default=7, help="pairs of runs per case")
    ap.add_argument("--seconds", type=float, default=4.0,
                    help="CPU seconds of each run (sized from a bare probe run)")
    args = ap.parse_args()
    pairs, seconds = (1, 0.5) if args.quick else (args.pairs, args.seconds)

    chain = chain_graph(12, batch=4096, width=256)
    two = memflow.Cluster.preset("2xV100-16GB")
    cases = [("chain of 12 units, 2×V100 (fast proposals)",
              lambda: memflow.MCMCSearch(chain, two, memory_limit=85e6, seed=0), 1000)]
    if not args.quick:
        t0 = time.perf_counter()
        resnet = memflow.zoo.graph("resnet50", batch_size=256)
        print(f"captured resnet50 in {time.perf_counter() - t0:.1f} s", flush=True)
        eight = memflow.Cluster.preset("8xV100-16GB")
        cases.append(("resnet50, batch 256, 8×V100",
                      lambda: memflow.MCMCSearch(resnet, eight, seed=0), 500))
    rows = [measure(name, make, probe, pairs, seconds) for name, make, probe in cases]
    df = pd.DataFrame(rows).set_index("case")
    print(table(df))
    if not (args.quick or args.no_write):
        write_section("dashboard", table(df) + (
            f"\n\n{pairs} pairs of runs per case (bare, dashboard; the order alternating), each "
            f"run sized to about {seconds:g} s of CPU from a bare probe run; proposals per "
            "second of the process's CPU time (medians; the pairs' interquartile range and "
            "extremes show how much the machine's other work moved single pairs) and of wall "
            "time. The dashboard's own share is the CPU time of the dashboard runs spent "
            "outside the search's steps (a same-run cross-check). The dashboard streams a point "
            "of progress into its charts every 0.2 s (less often when a flush would take more "
            "than 3% of the time) and redraws the best strategy's memory chart as it improves "
            "(at most every second and, after the first, within 2% of the time, on a budget of "
            "its own), and once more when the run ends; progress points per second and the "
            "longest gap between two of them are wall time while running. Target: keep at "
            "least 90% of the bare search's proposals per CPU second."),
            title="Dashboard overhead: proposals per second with and without the live views")

if __name__ == "__main__":
    main()
