"""A benchmark against an earlier revision, in the same run on the same machine: new / old.

A refactoring must not make the simulator or the search slower, and on a shared machine two
runs an hour apart are not comparable. This script checks out ``--rev`` into a temporary git
worktree and runs each named benchmark section alternately there and here (old, new, old,
new …, ``--rounds`` times), each time in its own process with its own tree's code and
script. Every run writes its table into its own tree's ``RESULTS.md``; the table is read back
from there, and the median of each rate over the rounds is compared. The ratio table goes into
the section ``bench_against`` of this tree's RESULTS.md.

Run: ``python benchmarks/bench_against.py --rev fb59d5a [--rounds 2] [--quick]``.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import table, write_section  # noqa: E402

HERE = Path(__file__).resolve().parent.parent
# (script, its arguments, the RESULTS.md section it writes, the columns to compare: rates)
CASES = (
    ("bench_sim.py", ["--quick"], "bench_sim", ("re-sim/s cpu", "new/s cpu")),
    # bench_search writes its table only when not --quick (a 60 s search per row)
    ("bench_search.py", ["--only", "speed"], "search_speed", None),
)


def read_section(results: Path, name: str) -> pd.DataFrame:
    """The first Markdown table of section ``name`` of ``results``, as a DataFrame."""
    text = results.read_text()
    m = re.search(rf"<!-- begin {re.escape(name)} -->(.*?)<!-- end {re.escape(name)} -->",
                  text, re.S)
    if m is None:
        raise SystemExit(f"{results}: no section {name!r} after the run")
    rows = [ln for ln in m.group(1).splitlines() if ln.startswith("|")]
    cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in rows]
    head, body = cells[0], [c for c in cells[2:] if len(c) == len(cells[0])]
    df = pd.DataFrame(body, columns=head)
    # a row is named by its leading text columns (model, units, …): as many as make it unique
    k = 1
    while df.iloc[:, :k].duplicated().any() and k < len(head):
        k += 1
    df.index = df.iloc[:, :k].agg(", ".join, axis=1)
    df.index.name = "case"
    return df.iloc[:, k:].apply(pd.to_numeric, errors="coerce")


def stamp(results: Path, name: str) -> str:
    """The section's text (its first line carries the command and the time it was written)."""
    text = results.read_text() if results.exists() else ""
    m = re.search(rf"<!-- begin {re.escape(name)} -->(.*?)<!-- end {re.escape(name)} -->",
                  text, re.S)
    return m.group(1) if m else ""


def run(tree: Path, script: str, args: list[str], section: str) -> pd.DataFrame:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = f"{tree}{os.pathsep}{tree / 'widgets'}"
    results = tree / "benchmarks" / "RESULTS.md"
    before = stamp(results, section)
    subprocess.run([sys.executable, str(tree / "benchmarks" / script), *args], cwd=tree,
                   env=env, check=True, stdout=subprocess.DEVNULL)
    if stamp(results, section) == before:    # a stale table is a wrong figure
        raise SystemExit(f"{tree}: {script} {' '.join(args)} did not rewrite section "
                         f"{section!r}")
    return read_section(results, section)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", required=True, help="the earlier revision (a commit or branch)")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    old_tree = Path(tempfile.mkdtemp(prefix="memflow-against-")) / "tree"
    subprocess.run(["git", "worktree", "add", "-q", "--detach", str(old_tree), args.rev],
                   cwd=HERE, check=True)
    rev = subprocess.run(["git", "rev-parse", "--short", args.rev], cwd=HERE, check=True,
                         capture_output=True, text=True).stdout.strip()
    loads, parts = [], []
    try:
        for script, sargs, section, cols in CASES:
            got: dict[str, list[pd.DataFrame]] = {"old": [], "new": []}
            for _ in range(args.rounds):
                for who, tree in (("old", old_tree), ("new", HERE)):
                    got[who].append(run(tree, script, sargs, section))
                    loads.append(os.getloadavg()[0])
            old, new = (pd.concat(got[w]).groupby(level=0, sort=False).median()
                        for w in ("old", "new"))
            # rates only ("proposals/s"; not "ms policy/segment", a time per proposal)
            cols = [c for c in (cols or [c for c in old.columns if c.endswith("/s")]) if c in new]
            for c in cols:
                ratio = (new[c] / old[c]).rename("new / old")
                parts.append(pd.DataFrame({"benchmark": section, "rate": c,
                                           "old": old[c], "new": new[c], "new / old": ratio}))
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(old_tree)], cwd=HERE)
    df = pd.concat(parts)
    df.index.name = "case"
    print(df.to_string())
    body = (f"Against `{rev}`, {args.rounds} alternating rounds (old, new, …), medians; load "
            f"average {np.min(loads):.1f}–{np.max(loads):.1f} on {os.cpu_count()} cores. "
            "Rates are per CPU second where the benchmark gives them (what an idle core "
            "would do). A ratio below 1 is a slow-down.\n\n" + table(df, ".4g"))
    write_section("bench_against", body, title=f"Speed against {rev} (same run, same machine)")


if __name__ == "__main__":
    main()
