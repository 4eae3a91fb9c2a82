"""Simulator speed: full simulations per second, and the 175B GPT on 1,024 GPUs.

Three figures per case:

* ``first`` — the first simulation of a strategy: memory plan, task expansion, costs, channel
  and device classes, schedule and ledger;
* ``re-sim/s`` — simulations per second of a strategy whose structure is cached (what a search
  pays when it revisits or re-times a strategy): schedule + ledger + peaks, every time;
* ``new/s`` — simulations per second when every strategy is new (a random unit's memory policy
  changed each time, as a search's move does): everything, every time.

Targets (issue 3): >= 1,000 simulations/s for resnet50 on 8 GPUs; the 96-layer 175B GPT on
1,024 GPUs (tensor × pipeline × data parallel) in under 1 s.

Run: ``python benchmarks/bench_sim.py [--quick]``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import memflow  # noqa: E402
from memflow.sim import Simulator  # noqa: E402
from memflow.sim.schedule import JIT  # noqa: E402
from memflow.strategy import POLICIES, Strategy  # noqa: E402
SEARCHED = POLICIES.searched
from _results import table, write_section  # noqa: E402


def _timed(step, seconds: float) -> tuple[float, float]:
    """(calls per second of wall time, calls per second of this process's CPU time) of
    ``step`` repeated for ``seconds``: on a shared machine the second is what an idle core
    would give."""
    n, t, c = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - t < seconds:
        step()
        n += 1
    return n / (time.perf_counter() - t), n / max(time.process_time() - c, 1e-9)


def rates(graph, cluster, strategy: Strategy, seconds: float, seed: int = 0) -> dict:
    sim = Simulator(graph, cluster)
    t, c = time.perf_counter(), time.process_time()
    first = sim.evaluate(strategy)
    t_first, c_first = time.perf_counter() - t, time.process_time() - c
    warm, warm_cpu = _timed(lambda: sim.evaluate(strategy), seconds)
    rng = np.random.default_rng(seed)
    names = graph.names
    state = {"s": strategy}

    def new() -> None:
        u = names[rng.integers(len(names))]
        policy = SEARCHED[rng.integers(len(SEARCHED))]      # keep, recompute or offload
        state["s"] = state["s"].with_policy({u: policy})
        sim.evaluate(state["s"])

    cold, cold_cpu = _timed(new, seconds)
    return {"tasks": len(sim.run(strategy).tasks.kind), "first_s": t_first,
            "first_cpu_s": c_first, "re-sim/s": warm, "re-sim/s cpu": warm_cpu, "new/s": cold,
            "new/s cpu": cold_cpu, "iteration_ms": first.iteration_time * 1e3,
            "peak_GiB": float(first.peak.max()) / 2 ** 30, "feasible": first.feasible}


def gpt175b():
    """The 96-layer, 12,288-hidden GPT-3 at global batch 1,536 × 2,048 tokens."""
    return memflow.zoo.graph("gpt2", batch_size=1536, seq_len=2048, n_layer=96, hidden=12288,
                             n_head=96, max_positions=2048, units="blocks",
                             autocast="bfloat16", backend="cuda")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="shorter timing windows")
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args()
    secs = 1.0 if args.quick else args.seconds
    rows = {}
    resnet = memflow.zoo.graph("resnet50", batch_size=256)
    for n, cluster in [(1, memflow.Cluster.preset("1xV100-16GB")),
                       (8, memflow.Cluster.preset("8xV100-32GB")),
                       (64, memflow.Cluster.build("V100-32GB", 8, 8))]:
        s = Strategy.single_device(resnet) if n == 1 else Strategy.data_parallel(resnet, cluster)
        rows[f"resnet50 b256, {n} GPU data parallel"] = rates(resnet, cluster, s, secs)
        print(rows)
    xl = memflow.zoo.graph("gpt2-xl", batch_size=8, seq_len=1024)
    c8 = memflow.Cluster.preset("8xV100-32GB")
    rows["gpt2-xl b8, 8 GPU hybrid dp=2 mp=4"] = rates(
        xl, c8, Strategy.hybrid(xl, c8, dp=2, mp=4), secs)
    print(rows)
    t = time.perf_counter()
    big = gpt175b()
    capture = time.perf_counter() - t
    c1024 = memflow.Cluster.preset("128x8xH100-80GB")
    s = Strategy.tensor_parallel(big, c1024, tp=8, pp=16, dp=8, microbatches=192)
    # Megatron-LM trained it with full activation recomputation
    s = s.with_policy(recompute=[u for u in big.names if big.units.at[u, "kind"] == "Block"])
    sim = Simulator(big, c1024, optimizer="adam")
    t, c = time.perf_counter(), time.process_time()
    r = sim.evaluate(s)
    first, first_cpu = time.perf_counter() - t, time.process_time() - c
    t, c = time.perf_counter(), time.process_time()
    sim.evaluate(s)
    again, again_cpu = time.perf_counter() - t, time.process_time() - c
    rows["GPT 175B (96 layers), 1,024 H100 tp=8 pp=16 dp=8, 192 microbatches, recompute"] = {
        "tasks": len(sim.run(s).tasks.kind), "first_s": first, "first_cpu_s": first_cpu,
        "re-sim/s": 1 / again, "re-sim/s cpu": 1 / again_cpu, "new/s": np.nan,
        "new/s cpu": np.nan, "iteration_ms": r.iteration_time * 1e3,
        "peak_GiB": float(r.peak.max()) / 2 ** 30, "feasible": r.feasible}
    df = pd.DataFrame.from_dict(rows, orient="index")
    df.index.name = "case"
    print(df.to_string())
    load = os.getloadavg()[0]
    body = (table(df) + f"\n\nLoad average while measuring: {load:.1f} on {os.cpu_count()} cores "
            "(timings scale with it). "
            f"numba: {'yes' if JIT else 'no (interpreted schedule)'}; the 175B "
            f"graph took {capture:.1f} s to capture (not counted). `first_s` includes building "
            "the tasks; `re-sim/s` re-runs schedule + ledger of a cached structure; `new/s` "
            "changes one random unit's memory policy before every simulation. Columns marked "
            "`cpu` divide by this process's CPU time instead of wall time: what one idle core "
            "gives, on a machine shared with other jobs.")
    write_section("bench_sim", body, title="Simulator speed")


if __name__ == "__main__":
    main()
