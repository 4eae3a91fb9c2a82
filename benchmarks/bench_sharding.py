"""Model states per GPU under DP and ZeRO-1/2/3 on gpt2-xl, memflow against ZeRO's formulas.

With bf16 parameters and gradients, fp32 master weights and fp32 Adam moments (``precision=
"bf16"``, ``optimizer="adam"``), ZeRO (Rajbhandari et al., SC 2020) gives per device, for Ψ
parameters over N data-parallel devices: 16Ψ (DDP), 4Ψ + 12Ψ/N (ZeRO-1, optimizer states
sharded), 2Ψ + 14Ψ/N (ZeRO-2, and gradients), 16Ψ/N (ZeRO-3 / FSDP full shard, and
parameters). memflow's numbers are ``SimResult.model_states`` (weights + gradients + optimizer,
each its maximum over the step) of a simulated step; the table also gives the simulated peak
(activations and communication buffers included) and step time. DeepSpeed is not installed here
(and is not to be installed), so its own estimators
(``estimate_zero2_model_states_mem_needs_all_cold`` …) are not run: the reference is the formulas
those estimators implement.

Run: ``python benchmarks/bench_sharding.py [--quick]`` (``--quick``: N = 8 only).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import memflow  # noqa: E402
from memflow.sim import Simulator  # noqa: E402
from _results import table, write_section  # noqa: E402

CLUSTERS = {8: "8xA100-80GB", 64: "8x8xH100-80GB"}
LEVELS = {"none": ("DDP", lambda n: 16), "optimizer": ("ZeRO-1", lambda n: 4 + 12 / n),
          "gradients": ("ZeRO-2", lambda n: 2 + 14 / n),
          "parameters": ("ZeRO-3 / FSDP", lambda n: 16 / n)}
GiB = 2 ** 30


def rows(graph, n: int) -> list[dict]:
    psi = float(graph.units["trainable_bytes"].sum()) / 4
    cluster = memflow.Cluster.preset(CLUSTERS[n])
    sim = Simulator(graph, cluster, optimizer="adam")
    out = []
    for level, (label, formula) in LEVELS.items():
        t = time.perf_counter()
        r = sim.result(memflow.Strategy.data_parallel(graph, cluster, shard=level,
                                                      precision="bf16"))
        got = float(r.model_states.sum(axis=1).max())
        want = formula(n) * psi
        out.append({"N": n, "cluster": CLUSTERS[n], "strategy": label,
                    "formula (GiB)": want / GiB, "memflow (GiB)": got / GiB,
                    "error %": 100 * (got / want - 1),
                    "peak (GiB)": float(r.peak_memory.max()) / GiB,
                    "step (ms)": r.iteration_time * 1e3,
                    "sim (s)": time.perf_counter() - t})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="N = 8 only")
    args = ap.parse_args()
    t = time.perf_counter()
    # units="blocks": one unit per transformer block, as FSDP wraps them (one all-gather each)
    g = memflow.zoo.graph("gpt2-xl", batch_size=64, seq_len=1024, units="blocks")
    capture = time.perf_counter() - t
    psi = float(g.units["trainable_bytes"].sum()) / 4
    df = pd.DataFrame([r for n in ((8,) if args.quick else (8, 64)) for r in rows(g, n)])
    print(df.to_string(index=False))
    worst = float(df["error %"].abs().max())
    body = (f"gpt2-xl (Ψ = {psi / 1e9:.3f} B parameters, batch 64, sequence 1024, "
            f"{len(g)} units, one per transformer block as FSDP wraps them; capture {capture:.0f} s), bf16 + Adam, data parallel over N "
            "devices. Formula: ZeRO's bytes per device (16Ψ, 4Ψ+12Ψ/N, 2Ψ+14Ψ/N, 16Ψ/N); "
            "memflow: `SimResult.model_states` summed (weights + gradients + optimizer). "
            f"Worst error {worst:.3f}%.\n\n" + table(df.drop(columns=["cluster"]))
            + "\n\nNote: DeepSpeed is not installed on this machine and must not be "
            "pip-installed here, so DeepSpeed's own estimators "
            "(`estimate_zero2_model_states_mem_needs_all_cold`, "
            "`estimate_zero3_model_states_mem_needs_all_cold`) were not run; the reference is "
            "the ZeRO paper's formulas, which those estimators implement for model states. "
            "Step times are the simulator's (ring collectives, FSDP all-gathers per unit "
            "prefetched one compute ahead), not measurements. Peaks include every activation "
            "kept (no recomputation): at N = 8 each GPU holds 8 sequences of 1024 tokens, over "
            "80 GB whatever the sharding; this table checks the model states.")
    write_section("bench_sharding", body, title="Sharded model states (ZeRO-1/2/3) on gpt2-xl")


if __name__ == "__main__":
    main()
