"""The fault table: the ``memflow`` command fed bad input, counting clear errors, tracebacks
and data lost.

A plan folder is searched once (chain of 4 blocks, 2×V100-16GB); then each case copies it,
spoils one thing — a field of ``strategy.json``, ``search.json`` or ``summary.json`` given a
wrong type, a wrong length or left out; a corrupt file; a bad argument, path or memory limit —
and runs one command in a process of its own. A case is

* a **clear error** when the command exits with the status the case expects (2 for bad input,
  3 for a search that finds nothing that fits) and writes exactly one line to stderr;
* a **traceback** when stderr holds one (target 0);
* **data lost** when a file of the input folder changed although the command failed
  (target 0).

Each case runs in a child process forked from one that has imported memflow (``--spawn``: a
fresh ``python -m memflow.cli`` per case, as a shell would, about ten times slower here); an
uncaught exception in the child prints Python's traceback and exits 1, as the interpreter
would. ``--kills N`` (default 20) adds ``N`` runs of ``benchmarks/bench_faults_kill.py``:
``memflow search`` killed with SIGKILL at random moments, the plan folder checked after each.

Run: ``python benchmarks/bench_faults.py`` (``--spawn`` for real interpreters, ``--no-write``
to leave RESULTS.md alone).
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks")]

from _results import table, write_section  # noqa: E402

from memflow.cli import main  # noqa: E402

SMALL = ["--model", "chain", "--option", "n=4", "--option", "width=32", "--batch", "8"]
CLUSTER = ["--cluster", "2xV100-16GB"]
LIMIT_S = 300          # a case that runs longer is counted as a hang

MISSING = object()
"""A case's value: leave the field out."""


# ------------------------------------------------------------------ the cases
def _wrong(value):
    """Wrong values for a field holding ``value``: each of JSON's other types, a wrong length,
    a wrong item, and the field left out."""
    out = {"null": None, "string": "x", "object": {"a": 1}, "missing": MISSING}
    if isinstance(value, list):
        out["too short"] = value[:-1] if len(value) > 1 else []
        out["too long"] = value + value[:1]
        if value:
            out["bad item"] = [1.5 if isinstance(value[0], str) else "x"] + value[1:]
    elif isinstance(value, bool):
        out["number"] = 1
    elif isinstance(value, (int, float)):
        out["bool"] = True
        out["negative"] = -1
        if isinstance(value, int):
            out["fraction"] = 2.5
    elif isinstance(value, str):
        out["number"] = 3
        del out["string"]
    else:
        out["list"] = [1]
    return out


def _set(doc, dotted: str, value) -> None:
    *parents, last = dotted.split(".")
    for key in parents:
        doc = doc[key]
    if value is MISSING:
        doc.pop(last, None)
    else:
        doc[last] = value


def _get(doc, dotted: str):
    for key in dotted.split("."):
        doc = doc[key]
    return doc


def cases(plan: Path) -> list[dict]:
    """Every case: kind, what is spoiled, the spoiling, the command, the expected status."""
    out = []
    simulate = ["simulate", *SMALL, *CLUSTER, "--strategy", "plan/strategy.json"]
    strategy = json.loads((plan / "strategy.json").read_text())
    for field, value in strategy.items():
        if field == "format":
            continue
        for how, bad in _wrong(value).items():
            if (field == "name" and how == "missing") or (field == "shard" and how in (
                    "missing", "null")):
                continue      # a strategy without shard levels shards nothing
            out.append(dict(kind="strategy.json field", what=f"{field}: {how}",
                            file="strategy.json", field=field, value=bad, argv=simulate))
    search = json.loads((plan / "search.json").read_text())
    fields = ([f"settings.{k}" for k in search["settings"]]
              + [f"chain.{k}" for k in ("seen_feasible", "memory_aware", "reference",
                                        "iteration", "since_restart", "elapsed")]
              + [f"chain.current.{k}" for k in ("units", "sample", "policy", "microbatches")]
              + [f"chain.best.{k}" for k in ("devices", "error_bound")]
              + [f"chain.{s}.{k}" for s in ("current_score", "best_score")
                 for k in ("cost", "time", "peak", "feasible")]
              + ["chain.rng.bit_generator", "chain.rng.state"]
              + [f"history.{k}" for k in ("iteration", "time", "feasible", "best_cost",
                                          "devices", "peaks")]
              + ["graph.fingerprint", "cluster.fingerprint", "pins.policies", "pins.configs",
                 "settings", "chain", "history", "graph_doc.units", "cluster_doc.devices"])
    for field in fields:
        value = _get(search, field)
        # the settings whose value may be null take other types: keep the others' wrong ones
        for how, bad in _wrong(value).items():
            if (field == "settings.memory_limit" and how in ("null", "string", "missing")) or \
                    (field in ("settings.moves", "settings.precision") and how == "null") or \
                    (field == "settings.runnable" and how == "missing") or \
                    (field in ("settings.policies", "settings.error_bounds")
                     and how.startswith("too")):
                continue          # valid values of these settings
            out.append(dict(kind="search.json field", what=f"{field}: {how}",
                            file="search.json", field=field, value=bad,
                            argv=["report", "plan"]))
    out.append(dict(kind="search.json field", what="chain.current.units: a unit renamed",
                    file="search.json", field="chain.current.units",
                    value=["renamed"] + _get(search, "chain.current.units")[1:],
                    argv=["report", "plan"]))
    for field, bad in (("iterations", "many"), ("search_seconds", "x"),
                       ("acceptance_rate", "x"), ("model", 3), ("format", "memflow.other/1")):
        out.append(dict(kind="summary.json field", what=f"{field}: {bad!r}",
                        file="summary.json", field=field, value=bad, argv=["report", "plan"]))
    for name in ("strategy.json", "search.json", "summary.json"):
        for how, text in (("truncated", None), ("empty", ""), ("not JSON", "{nope"),
                          ("a list", "[1, 2]")):
            argv = simulate if name == "strategy.json" else ["report", "plan"]
            out.append(dict(kind="corrupt file", what=f"{name}: {how}", file=name,
                            text=text, argv=argv))
    # a strategy from another run: the model in search.json no longer matches
    out.append(dict(kind="corrupt file", what="search.json from another model",
                    file="search.json", other_model=True, argv=["report", "plan"]))
    args = [
        ("model", ["search", "--model", "nonesuch", "--batch", "8", *CLUSTER]),
        ("model", ["search", "--model", "nofile.py:make", "--batch", "8", *CLUSTER]),
        ("model", ["search", "--model", "chain", "--option", "nonesuch=3", "--batch", "8",
                   *CLUSTER, "--iterations", "1"]),
        ("model", ["search", "--model", "chain", "--option", "n", "--batch", "8", *CLUSTER]),
        ("batch", ["search", "--model", "chain", "--batch", "0", *CLUSTER]),
        ("batch", ["search", "--model", "chain", "--batch", "x", *CLUSTER]),
        ("cluster", ["search", *SMALL, "--cluster", "3xFOO"]),
        ("cluster", ["search", *SMALL]),
        ("units", ["search", *SMALL, *CLUSTER, "--units", "some"]),
        ("budget", ["search", *SMALL, *CLUSTER, "--iterations", "0"]),
        ("budget", ["search", *SMALL, *CLUSTER, "--seconds", "-1"]),
        ("budget", ["search", *SMALL, *CLUSTER, "--seconds", "1", "--iterations", "2"]),
        ("command", ["frobnicate"]),
        ("command", []),
        ("input shape", ["search", *SMALL, *CLUSTER, "--input-shape", "3,x"]),
        ("optimizer", ["simulate", *SMALL, *CLUSTER, "--strategy", "plan/strategy.json",
                       "--optimizer", "lion"]),
    ]
    for what, argv in args:
        out.append(dict(kind="bad argument", what=what, argv=argv))
    # a batch that the strategy's sample degree (2, on both GPUs) does not divide; the
    # searched plan may run on one GPU, where any batch divides
    out.append(dict(kind="bad argument", what="batch", file="strategy.json", field="sample",
                    value=[2] * len(strategy["units"]), also={"devices": [["gpu0", "gpu1"]] * len(
                        strategy["units"])},
                    argv=["simulate", "--model", "chain", "--option", "n=4", "--option",
                          "width=32", "--batch", "7", *CLUSTER, "--strategy",
                          "plan/strategy.json"]))
    paths = [
        ("strategy missing", ["simulate", *SMALL, *CLUSTER, "--strategy", "none.json"]),
        ("strategy is a folder", ["simulate", *SMALL, *CLUSTER, "--strategy", "plan"]),
        ("export strategy missing", ["export", *SMALL, "--strategy", "none.json"]),
        ("export out not .py", ["export", *SMALL, "--strategy", "plan/strategy.json",
                                "--out", "plan/train.txt"]),
        ("report folder missing", ["report", "no/such/plan"]),
        ("report on a file", ["report", "plan/strategy.json"]),
        ("report out not .html", ["report", "plan", "--out", "plan/r.txt"]),
        ("search out under a file", ["search", *SMALL, *CLUSTER, "--iterations", "2",
                                     "--quiet", "--out", "plan/strategy.json/sub"]),
    ]
    for what, argv in paths:
        out.append(dict(kind="bad path", what=what, argv=argv))
    limits = ["lots", "-1", "0", "0.5B", "1e-20%", "150%x", "nan", "inf", "{}"]
    for value in limits:
        out.append(dict(kind="bad limit", what=value,
                        argv=["search", *SMALL, *CLUSTER, "--iterations", "2", "--quiet",
                              "--memory-limit", value, "--out", "out"]))
    out.append(dict(kind="infeasible search", what="4KiB per GPU", expect=3,
                    argv=["search", *SMALL, *CLUSTER, "--iterations", "5", "--quiet",
                          "--memory-limit", "4KiB", "--out", "out"]))
    return out


# ------------------------------------------------------------------ running one case
def _prepare(case: dict, plan: Path, other: Path, work: Path) -> None:
    shutil.copytree(plan, work / "plan")
    if "value" in case:
        path = work / "plan" / case["file"]
        doc = json.loads(path.read_text())
        _set(doc, case["field"], case["value"])
        for field, value in case.get("also", {}).items():
            _set(doc, field, value)
        path.write_text(json.dumps(doc))
    elif "text" in case:
        path = work / "plan" / case["file"]
        text = case["text"]
        path.write_text(path.read_text()[: len(path.read_text()) // 2] if text is None
                        else text)
    elif case.get("other_model"):
        shutil.copy(other / "search.json", work / "plan" / "search.json")


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _fork(argv: list[str], work: Path) -> tuple[int, str]:
    err = work / "stderr.txt"
    pid = os.fork()
    if pid == 0:                                      # the child: one command, then exit
        code = 1
        try:
            os.chdir(work)
            fd_out = os.open(work / "stdout.txt", os.O_WRONLY | os.O_CREAT)
            fd_err = os.open(err, os.O_WRONLY | os.O_CREAT)
            os.dup2(fd_out, 1)
            os.dup2(fd_err, 2)
            sys.stdout = open(1, "w", closefd=False)
            sys.stderr = open(2, "w", closefd=False)
            code = main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:                         # what the interpreter would print
            traceback.print_exc()
            code = 1
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)
    start = time.monotonic()
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() - start > LIMIT_S:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return 124, "hang"
        time.sleep(0.02)
    return os.waitstatus_to_exitcode(status), err.read_text() if err.exists() else ""


def _spawn(argv: list[str], work: Path) -> tuple[int, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), str(ROOT / "widgets"), os.environ.get("PYTHONPATH", "")])}
    try:
        run = subprocess.run([sys.executable, "-m", "memflow.cli", *argv], cwd=work, env=env,
                             capture_output=True, text=True, timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        return 124, "hang"
    return run.returncode, run.stderr


def run_case(case: dict, plan: Path, other: Path, spawn: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        _prepare(case, plan, other, work)
        before = _digest(work / "plan")
        code, err = (_spawn if spawn else _fork)(case["argv"], work)
        after = _digest(work / "plan")
    expect = case.get("expect", 2)
    lines = err.strip("\n").splitlines() if err else []
    tail = [line for line in lines if "\r" not in line]   # tqdm's bar rewrites one line
    lost = code != 0 and any(after.get(k) != v for k, v in before.items())
    return {"kind": case["kind"], "what": case["what"], "exit": code,
            "clear": code == expect and len(tail) == 1 and "Traceback" not in err,
            "traceback": "Traceback" in err, "lost": lost,
            "message": tail[-1][:160] if tail else ""}


# ------------------------------------------------------------------ the table
def _plan(folder: Path, argv: list[str]) -> Path:
    with contextlib.redirect_stdout(open(os.devnull, "w")):
        code = main(["search", *argv, "--iterations", "20", "--quiet", "--out", str(folder)])
    assert code == 0, f"the base search failed ({code})"
    return folder


def _kill_counts(n: int) -> dict | None:
    """``n`` runs of the kill -9 benchmark (:func:`bench_faults_kill.kill_runs`); None for 0."""
    if n <= 0:
        return None
    from bench_faults_kill import kill_runs

    return kill_runs(n, seed=0)


def main_bench(argv: list[str] | None = None) -> pd.DataFrame:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spawn", action="store_true", help="a fresh interpreter per case")
    ap.add_argument("--no-write", action="store_true", help="leave RESULTS.md alone")
    ap.add_argument("--show", type=int, default=0, help="print this many messages per kind")
    ap.add_argument("--kills", type=int, default=20,
                    help="kill -9 runs of benchmarks/bench_faults_kill.py (0: none)")
    args = ap.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="memflow-faults-"))
    try:
        plan = _plan(base / "plan", [*SMALL, *CLUSTER])
        other = _plan(base / "other", ["--model", "chain", "--option", "n=3", "--option",
                                       "width=8", "--batch", "8", *CLUSTER])
        all_cases = cases(plan)
        start = time.perf_counter()
        rows = []
        for i, case in enumerate(all_cases):
            rows.append(run_case(case, plan, other, args.spawn))
            r = rows[-1]
            if not r["clear"]:
                print(f"[{i + 1}/{len(all_cases)}] NOT CLEAR {r['kind']} / {r['what']}: "
                      f"exit {r['exit']}: {r['message']}", flush=True)
        seconds = time.perf_counter() - start
    finally:
        shutil.rmtree(base, ignore_errors=True)
    df = pd.DataFrame(rows)
    summary = df.groupby("kind", sort=False).agg(
        **{"inputs tried": ("what", "size"), "clear errors": ("clear", "sum"),
           "tracebacks": ("traceback", "sum"), "data lost": ("lost", "sum")})
    summary.loc["total"] = summary.sum()
    summary = summary.astype(int)
    print(summary.to_string())
    for kind, group in df.groupby("kind", sort=False):
        for _, r in group.head(args.show).iterrows():
            print(f"  {kind} / {r['what']}: exit {r['exit']}: {r['message']}")
    body = (f"{len(df)} bad inputs, each in a copy of a plan folder, run with "
            f"{'a fresh interpreter' if args.spawn else 'a forked process'} per case "
            f"({seconds:.0f} s). Clear: the expected exit status (2 bad input, 3 a search "
            "that finds nothing that fits) with one line on stderr. Data lost: a file of the "
            "input folder changed by a failed command.\n\n" + table(summary))
    kill = _kill_counts(args.kills)
    if kill is not None:
        print("kill -9:", kill)
        body += "\n\n`kill -9` runs (benchmarks/bench_faults_kill.py):\n\n" + table(
            pd.DataFrame([kill]))
    unclear = df[~df["clear"]]
    if len(unclear):
        body += "\n\nNot clear:\n\n" + table(unclear[["kind", "what", "exit", "message"]])
    if not args.no_write:
        write_section("bench_faults", body, title="Fault table: bad input to the memflow command")
    return df


if __name__ == "__main__":
    main_bench()
