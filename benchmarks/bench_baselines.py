"""memflow's search against the baselines, on the same simulated cluster (issue 4).

For resnet50, resnet101, gpt2 and vgg16 at batches that do not fit one GPU — nor four GPUs
with plain data parallelism — on a ``4xV100-16GB`` cluster, this gives, per model:

* ``data parallel`` — keep everything, the batch split over the four GPUs;
* ``FlexFlow (memory-oblivious)`` — the same Metropolis search with FlexFlow's cost (time
  only) and moves (parallel configurations only), as long as memflow's search: its best by
  time, whatever its memory;
* ``recompute everything`` — data parallel, every unit recomputed as its own checkpoint
  segment (``Strategy.with_segments("each")``: Chen's / Checkmate's "checkpoint every unit",
  only each unit's input held; one segment over the whole model would peak like data parallel);
* ``sqrt checkpointing`` — data parallel with Chen et al.'s checkpoints (their greedy over a
  grid of budgets, :func:`memflow.planners.checkpoint.chen_checkpoints`; the fastest that fits);
* ``optimal chain schedule`` — :func:`memflow.planners.optimal_checkpointing` on the
  data-parallel placement, where the graph is a chain;
* ``memflow search`` — :class:`memflow.MCMCSearch`, memory-aware, started from the best of the
  rows above (and of its own baselines), for the same time as FlexFlow's.

Columns: time (ms per iteration), the peak of each GPU (GiB), feasible. The checks at the end:
memflow is feasible wherever any row is, and never slower than the fastest feasible row; and a
search started from each row's strategy (``--from-each`` proposals, memory-aware) ends no worse
than where it started (feasible before infeasible, then faster; infeasible: lower cost).

Granularity: resnet50/101 at depth 2 (one unit per bottleneck), gpt2 with ``units="blocks"``
(one per transformer block), vgg16 at leaves (one per layer) — units at which recomputation
decisions are meaningful and the search still takes a few hundred steps per minute.

Every search trains in fp32, the baselines' precision (:meth:`MCMCSearch.pin_precision`): amp
alone is ~5x on a V100, a change of numerics that would hide what memory and parallelism win.

Run: ``python benchmarks/bench_baselines.py [--seconds 120] [--quick]``.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import memflow  # noqa: E402
from memflow.errors import SearchError  # noqa: E402
from memflow.planners import chain_violation, optimal_checkpointing  # noqa: E402
from memflow.planners.checkpoint import chen_checkpoints  # noqa: E402
from memflow.search import MCMCSearch  # noqa: E402
from memflow.sim import Simulator  # noqa: E402
from memflow.strategy import Strategy  # noqa: E402
from _compare import flexflow, no_worse  # noqa: E402
from _results import table, write_section  # noqa: E402

CLUSTER = "4xV100-16GB"
PLANNERS = "fp32"      # the precision every baseline trains at
MODELS = {  # name: (batch, capture options, granularity label)
    "resnet50": (1024, {"units": 2}, "depth 2 (bottlenecks)"),
    "resnet101": (768, {"units": 2}, "depth 2 (bottlenecks)"),
    "gpt2": (32, {"units": "blocks"}, "blocks"),
    "vgg16": (1024, {}, "leaves"),
}
QUICK = {"resnet50": 256, "resnet101": 128, "gpt2": 8, "vgg16": 128}
GIB = 2 ** 30


def sqrt_checkpointing(g, dp: Strategy, sim: Simulator) -> Strategy:
    """Chen et al.'s greedy checkpoints on the data-parallel placement: fastest that fits."""
    saved = g.units["saved_bytes"].to_numpy(float)
    pos = saved[saved > 0]
    tries = []
    for budget in np.unique(np.geomspace(max(pos.min(), 1.0), max(pos.sum(), 1.0), 24)):
        kept = set(chen_checkpoints(saved, budget).tolist())
        s = dp.with_policy(recompute=[u for i, u in enumerate(g.names) if i not in kept])
        ev = sim.evaluate(s)
        tries.append((not ev.feasible, ev.iteration_time if ev.feasible else ev.peak.max(), s))
    return min(tries, key=lambda x: x[:2])[2].with_schedule(name="sqrt checkpointing")


def row(name: str, s: Strategy, sim: Simulator) -> dict:
    ev = sim.evaluate(s)
    out = {"strategy": name, "time_ms": ev.iteration_time * 1e3, "feasible": ev.feasible}
    for d, p in zip(sim.cluster.devices.index, ev.peak):
        out[f"{d}_GiB"] = p / GIB
    return out


def bench(model: str, batch: int, capture: dict, seconds: float,
          iterations: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    cluster = memflow.Cluster.preset(CLUSTER)
    t = time.perf_counter()
    g = memflow.zoo.graph(model, batch_size=batch, **capture)
    sim = Simulator(g, cluster)
    dp = Strategy.data_parallel(g, cluster)
    rows = {"data parallel": dp,
            "recompute everything": dp.with_policy(recompute=list(g.names)).with_segments("each"),
            "sqrt checkpointing": sqrt_checkpointing(g, dp, sim)}
    if chain_violation(g) is None:
        try:
            rows["optimal chain schedule"] = optimal_checkpointing(g, cluster, base=dp).strategy
        except SearchError as exc:        # nothing fits: say so in the table
            print(f"  {model}: optimal chain schedule: {exc}")
    flex = flexflow(g, cluster, seconds)
    rows["FlexFlow (memory-oblivious)"] = flex.best
    scored = {k: sim.evaluate(s) for k, s in rows.items()}
    feasible = [k for k, ev in scored.items() if ev.feasible]
    start = min(feasible, key=lambda k: scored[k].iteration_time) if feasible else "baseline"
    init = rows[start] if feasible else "baseline"
    search = MCMCSearch(g, cluster, init=init, seed=0).pin_precision(PLANNERS).run(
        seconds=seconds)
    rows["memflow search"] = search.best
    out = pd.DataFrame([row(k, s, sim) for k, s in rows.items()])
    out.insert(0, "model", f"{model} b={batch}")
    out["started_from"] = ""
    out.loc[out["strategy"] == "memflow search", "started_from"] = start
    print(f"  {model}: {len(g)} units, {search.iteration} proposals "
          f"({flex.iteration} for FlexFlow) in {time.perf_counter() - t:.0f} s")
    starts = from_each_start(g, cluster, {k: s for k, s in rows.items()
                                          if k != "memflow search"}, iterations)
    starts.insert(0, "model", f"{model} b={batch}")
    return out, starts


def from_each_start(g, cluster, rows: dict[str, Strategy], iterations: int) -> pd.DataFrame:
    """A memory-aware search of ``iterations`` proposals from each strategy in ``rows``:
    where it started, where it ended, and whether the end is no worse (the chain only reports
    a feasible best once it has seen one, and never a worse one)."""
    out = []
    for name, s in rows.items():
        search = MCMCSearch(g, cluster, init=s, seed=0).pin_precision(PLANNERS)
        first = search.best_score
        search.run(iterations=iterations)
        end = search.best_score
        out.append({"started_from": name, "start_ms": first.time * 1e3,
                    "start_feasible": first.feasible, "end_ms": end.time * 1e3,
                    "end_feasible": end.feasible, "no_worse": no_worse(first, end)})
    return pd.DataFrame(out)


def check(df: pd.DataFrame) -> list[str]:
    """The done-when: memflow feasible wherever any row is, never slower than the fastest."""
    notes = []
    for model, part in df.groupby("model", sort=False):
        mine = part[part["strategy"] == "memflow search"].iloc[0]
        others = part[(part["strategy"] != "memflow search") & part["feasible"]]
        if len(others) and not mine["feasible"]:
            notes.append(f"{model}: FAILED — memflow infeasible where {list(others['strategy'])}"
                         " fit")
        elif len(others) and mine["time_ms"] > others["time_ms"].min() * (1 + 1e-9):
            notes.append(f"{model}: FAILED — memflow {mine['time_ms']:.1f} ms slower than "
                         f"{others['time_ms'].min():.1f} ms")
        else:
            best = others["time_ms"].min() if len(others) else math.nan
            notes.append(f"{model}: ok — memflow {mine['time_ms']:.1f} ms, feasible "
                         f"{bool(mine['feasible'])}; fastest feasible baseline {best:.1f} ms")
    return notes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=120.0,
                    help="search time per model (memflow and FlexFlow each)")
    ap.add_argument("--from-each", type=int, default=300,
                    help="proposals of the search started from each row's strategy")
    ap.add_argument("--quick", action="store_true",
                    help="small batches, 10 s searches, 50 proposals from each start")
    ap.add_argument("--models", nargs="*", default=list(MODELS))
    args = ap.parse_args()
    seconds = 10.0 if args.quick else args.seconds
    each = 50 if args.quick else args.from_each
    frames, starts = [], []
    for model in args.models:
        batch, capture, _ = MODELS[model]
        rows, from_each = bench(model, QUICK[model] if args.quick else batch, capture, seconds,
                                each)
        frames.append(rows)
        starts.append(from_each)
    df, st = pd.concat(frames, ignore_index=True), pd.concat(starts, ignore_index=True)
    notes = check(df)
    bad = st[~st["no_worse"]]
    notes.append(f"search from each row's strategy ({each} proposals): no worse than its start "
                 f"in {len(st) - len(bad)}/{len(st)}" + "".join(
                     f"; FAILED from {r.started_from} on {r.model}" for r in bad.itertuples()))
    print(df.to_string(index=False))
    print(st.to_string(index=False))
    print("\n".join(notes))
    if args.quick:
        return
    gran = "; ".join(f"{m}: {MODELS[m][2]}" for m in args.models)
    body = (f"Cluster {CLUSTER}; each search ran {seconds:.0f} s (memflow memory-aware from the "
            f"best row, FlexFlow memory-oblivious from data parallel). Units: {gran}.\n\n"
            + table(df.set_index("model"), ".3g") + "\n\n" + "\n".join(f"- {n}" for n in notes)
            + f"\n\nThe search ({each} proposals, seed 0) started from each row's strategy:\n\n"
            + table(st.set_index("model"), ".4g"))
    write_section("bench_baselines", body, title="Search against the baselines (issue 4)")


if __name__ == "__main__":
    main()
