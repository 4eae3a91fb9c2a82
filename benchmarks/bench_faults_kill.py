"""``kill -9`` at random moments of ``memflow search``: the plan folder stays one set.

Each run is ``python -m memflow.cli search`` on a tiny chain into a folder that already holds a
complete plan (the previous run's), killed with SIGKILL either after a random delay over the
whole run (start-up, capture, search, write) or, every other run, at a random moment of the
writing of its files (the moment that matters, and a short one: ``killed writing``). The folder
is then classified: the old complete set, the new complete set, absent, mixed (files from two
runs) or unreadable (a file cannot be read, or ``memflow report`` fails on it). Each run makes
a different number of proposals, which every file records, so a mixed folder is seen. Leftovers
(hidden staging folders, ``.tmp`` files) are counted inside the plan folder after every kill,
and beside it after a last run that is not killed (a finished run must clean what killed runs
left).

Run: ``python benchmarks/bench_faults_kill.py [-n 20] [--seed 0]``; the fault benchmark calls
:func:`kill_runs`.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = ("runs", "killed", "killed writing", "complete-old", "complete-new", "absent",
           "mixed", "unreadable", "leftover tmp")
STATES = ("complete-old", "complete-new", "absent", "mixed", "unreadable")
BASE_ITERATIONS = 20
# s: a kill "while writing" lands at most this long after its first file is seen; the write
# (four files, fsync each, swap) takes 70-100 ms on a loaded 2-core box and polling sees the
# first file late, so some kills land before the swap and some after
WRITING = 0.08


def _command(out: Path, iterations: int) -> list[str]:
    return [sys.executable, "-m", "memflow.cli", "search", "--model", "chain", "--option", "n=3",
            "--option", "width=16", "--batch", "8", "--cluster", "2xV100-16GB",
            "--iterations", str(iterations), "--seed", str(iterations), "--quiet",
            "--out", str(out)]


def _env() -> dict[str, str]:
    path = os.pathsep.join([str(ROOT), str(ROOT / "widgets"), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path}


def proposals(out: Path) -> set[int]:
    """The number of proposals each file of plan folder ``out`` records (one value: one run)."""
    import pandas as pd

    from memflow.search.persist import read_search

    strategy = json.loads((out / "strategy.json").read_text())["name"]
    return {int(strategy.split("best of ")[1].split(" ")[0].replace(",", "")),
            len(read_search(out / "search.json")["history"]["cost"]),
            len(pd.read_csv(out / "history.csv")),
            int(json.loads((out / "summary.json").read_text())["iterations"])}


def classify(out: Path, old: int | None, new: int, *, report: bool = True) -> str:
    """``out``'s state after a kill: one of STATES (``old``/``new``: the runs' proposals).
    Readable means ``memflow report`` writes its report (``report=False``: reads what it
    reads, the search and the strategy checked against it, without drawing)."""
    from memflow import MCMCSearch, Strategy
    from memflow.report import write_plan_report

    if not out.exists():
        return "absent"
    try:
        found = proposals(out)
        if report:
            with tempfile.TemporaryDirectory() as where:
                write_plan_report(out, Path(where) / "report.html")
        else:
            search = MCMCSearch.load(out / "search.json")
            Strategy.from_json(out / "strategy.json").validate(search.graph, search.cluster)
    except Exception:            # any failure to read is what this benchmark counts
        return "unreadable"
    if found == {old}:
        return "complete-old"
    return "complete-new" if found == {new} else "mixed"


def tmp_inside(out: Path) -> int:
    """Temporary files inside plan folder ``out`` (a finished write leaves none)."""
    return sum(1 for _ in out.rglob("*.tmp")) if out.is_dir() else 0


def leftovers(out: Path) -> int:
    """Temporary files inside plan folder ``out`` and hidden staging folders beside it."""
    return tmp_inside(out) + sum(1 for p in out.parent.iterdir()
                                 if p.name.startswith(f".{out.name}."))


def _writing(out: Path) -> bool:
    # the run has begun writing: its staging folder holds a file
    for staging in out.parent.glob(f".{out.name}.new-*"):
        try:
            if any(staging.iterdir()):
                return True
        except OSError:          # swapped in or cleaned away meanwhile
            pass
    return False


def _run(out: Path, iterations: int, rng: random.Random, mode: str | None,
         span: float) -> tuple[bool, float]:
    """One run, killed per ``mode`` (None: not killed); whether it was killed, and when."""
    start = time.perf_counter()
    proc = subprocess.Popen(_command(out, iterations), env=_env(), cwd=out.parent,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        if mode == "random":
            deadline = start + rng.uniform(0.0, span)
            while proc.poll() is None and time.perf_counter() < deadline:
                time.sleep(0.002)
        elif mode == "write":
            while proc.poll() is None and not _writing(out):
                time.sleep(0.001)
            time.sleep(rng.uniform(0.0, WRITING))
    except BaseException:
        proc.kill()
        raise
    killed = mode is not None and proc.poll() is None
    if killed:
        proc.send_signal(signal.SIGKILL)
    code = proc.wait()
    if mode is None and code != 0:
        raise RuntimeError(f"{' '.join(_command(out, iterations))} exited {code}")
    return killed, time.perf_counter() - start


def kill_runs(n: int, seed: int) -> dict[str, int]:
    """``n`` runs of ``memflow search`` killed at random moments (see the module docstring),
    between a first and a last run left to finish; the counts of COLUMNS.

    ``leftover tmp`` counts ``.tmp`` files inside the plan folder after each kill plus what
    the last, finished run leaves beside it (0 when killed runs' staging is cleaned).
    """
    rng = random.Random(seed)
    counts = dict.fromkeys(COLUMNS, 0)
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        out = where / "plan"
        old = BASE_ITERATIONS
        _, span = _run(out, old, rng, None, 0.0)          # the old set, and a run's length
        for i in range(n):
            new = BASE_ITERATIONS + 1 + i
            killed, _ = _run(out, new, rng, "write" if i % 2 else "random", 1.1 * span)
            counts["runs"] += 1
            counts["killed"] += killed
            counts["killed writing"] += killed and i % 2 == 1
            state = classify(out, old, new)
            counts[state] += 1
            counts["leftover tmp"] += tmp_inside(out)
            if state == "complete-new":
                old = new
        _run(out, BASE_ITERATIONS + n + 1, rng, None, 0.0)
        counts["leftover tmp"] += leftovers(out)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=20, help="killed runs (default 20)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import pandas as pd
    from _results import table, write_section

    start = time.perf_counter()
    counts = kill_runs(args.n, args.seed)
    frame = pd.DataFrame([counts])
    print(frame.to_string(index=False))
    body = ("`memflow search` (chain of 3 blocks, 2xV100-16GB) killed with SIGKILL at random "
            "moments, half of them while it writes the plan folder (within 80 ms of its first "
            "file), over a folder holding the previous run's plan; every file records its run's "
            "number of proposals. Targets: mixed 0, unreadable 0, leftover tmp 0.\n\n"
            + table(frame) + f"\n\n{time.perf_counter() - start:.0f} s in all.")
    write_section("bench_faults_kill", body, title="Faults: kill -9 during memflow search")


if __name__ == "__main__":
    main()
