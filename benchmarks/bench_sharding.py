"""Model states per GPU under DP and ZeRO-1/2/3 (gpt2-xl, Llama-2-7B) against ZeRO's formulas.

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

The second table is a Llama-2-7B (``llama2-7b``, Ψ = 6.74 B) at sequence 4096, global batch 64
sequences, bf16 + Adam, captured with the CUDA saved-tensor rules (flash attention), on
8×A100-80GB and on 64×H100-80GB: data parallelism, ZeRO-1/2/3 (each GPU's sequences as
micro-batches of one, gradient accumulation), FSDP (ZeRO-3) with every block recomputed,
Megatron-style TP×PP (1F1B), and memflow's search started from the fastest of them that fits.
Per-GPU model states are set against ZeRO's formulas and DeepSpeed's estimators'
(``estimate_zero2_model_states_mem_needs`` without offload: 4Ψ + 16Ψ/N;
``estimate_zero3_model_states_mem_needs``: 4·(largest layer) + 18Ψ/N; DeepSpeed's
``runtime/zero/stage_1_and_2.py`` and ``stage3.py``), which count fp32 gradients beside the
fp16 ones and no 1.5× buffer factor on the GPU.

Run: ``python benchmarks/bench_sharding.py [--quick] [--search-seconds S]`` (``--quick``:
N = 8 only, for both models).
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
from memflow.strategy.runnable import unrunnable  # noqa: E402
from _results import table, write_section  # noqa: E402

CLUSTERS = {8: "8xA100-80GB", 64: "8x8xH100-80GB"}
LEVELS = {"none": ("DDP", lambda n: 16), "optimizer": ("ZeRO-1", lambda n: 4 + 12 / n),
          "gradients": ("ZeRO-2", lambda n: 2 + 14 / n),
          "parameters": ("ZeRO-3 / FSDP", lambda n: 16 / n)}
GiB = 2 ** 30


REFUSED: dict[str, str] = {}     # row label -> why export refuses its strategy (first seen)

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


LLAMA = {8: "8xA100-80GB", 64: "8x8xH100-80GB"}
BATCH, SEQ = 64, 4096


def _zero_formulas(level: str, n: int, psi: float, largest: float) -> tuple[float, float]:
    """(ZeRO paper, DeepSpeed estimator) model-state bytes per GPU; NaN where the estimator
    has no function (stage 1 shares stage 2's, and DDP none)."""
    paper = LEVELS[level][1](n) * psi
    deepspeed = {"gradients": 4 * psi + 16 * psi / n,
                 "parameters": 4 * largest + 18 * psi / n}.get(level, float("nan"))
    return paper, deepspeed


def llama_rows(graph, n: int, search_seconds: float) -> list[dict]:
    """What fits and how fast for the 7B model on ``n`` GPUs, one row per strategy."""
    cluster = memflow.Cluster.preset(LLAMA[n])
    devices = list(cluster.devices.index)[:n]
    sim = Simulator(graph, cluster, optimizer="adam", precision="bf16")
    psi = float(graph.units["trainable_bytes"].sum()) / 4
    largest = float(graph.units["params"].max())
    per_gpu = BATCH // n                 # sequences per GPU: micro-batches of one
    layers = [u for u in graph.names if u.startswith("layers.")]
    dp = {level: memflow.Strategy.data_parallel(graph, devices, shard=level).with_schedule(
        microbatches=per_gpu) for level in LEVELS}
    plans = {LEVELS[level][0]: s for level, s in dp.items()}
    plans["FSDP + full recompute"] = memflow.Strategy.data_parallel(
        graph, devices, shard="parameters").with_policy(recompute=layers).with_segments("each")
    for tp, pp in ((8, 1), (4, 2), (8, 2)):
        if n % (tp * pp) == 0:
            plans[f"TP{tp}×PP{pp}×DP{n // (tp * pp)}"] = memflow.Strategy.tensor_parallel(
                graph, devices, tp=tp, pp=pp, dp=n // (tp * pp),
                microbatches=BATCH // (n // (tp * pp)))
    out, results = [], {}
    for label, s in plans.items():
        t = time.perf_counter()
        r = results[label] = sim.result(s)
        out.append(_llama_row(n, label, r, psi, largest, time.perf_counter() - t, graph))
    fitting = {k: r for k, r in results.items() if r.feasible}
    exported = {k: r for k, r in fitting.items() if unrunnable(plans[k], graph) is None}
    if fitting and search_seconds > 0:
        # the export space (default) from the fastest start export runs, and FlexFlow's full
        # space from the fastest of all (it keeps that start's 1F1B)
        for space, runnable, starts in (("export space", True, exported),
                                        ("full space", False, fitting)):
            if not starts:
                continue
            start = min(starts, key=lambda k: starts[k].iteration_time)
            t = time.perf_counter()
            search = memflow.MCMCSearch(graph, cluster, init=plans[start], optimizer="adam",
                                        precision="bf16", seed=0, runnable=runnable)
            search.run(seconds=search_seconds)
            out.append(_llama_row(n, f"search, {space}, from {start} ({search.iteration} "
                                  "proposals)", search.best_result, psi, largest,
                                  time.perf_counter() - t, graph))
    return out


def _llama_row(n, label, r, psi, largest, seconds, graph) -> dict:
    s = r.strategy
    why = unrunnable(s, graph)
    if why is not None:
        REFUSED.setdefault(f"{n} GPUs, {label.split(' (')[0]}", why)
    levels = set(s.shard_levels)
    level = s.shard_levels[2] if len(levels) == 1 else "mixed"   # a search may mix levels
    states = float(r.model_states.sum(axis=1).max())
    # ZeRO's formulas are for data parallelism alone, one level for every unit: no tensor
    # split, one pipeline stage
    pure = s.parameter.max() == 1 and int(s.stage.max()) <= 0 and len(levels) == 1
    paper, deepspeed = _zero_formulas(level, int(s.sample[2]), psi, largest) \
        if pure else (float("nan"), float("nan"))
    return {"N": n, "strategy": label, "shard": level,
            "model states (GiB)": states / GiB, "ZeRO formula (GiB)": paper / GiB,
            "DeepSpeed est. (GiB)": deepspeed / GiB, "peak (GiB)": float(r.peak_memory.max()) / GiB,
            "fits": "yes" if r.feasible else "no", "step (s)": r.iteration_time,
            "tokens/s": BATCH * SEQ / r.iteration_time, "export runs": "yes" if why is None else "no",
            "sim (s)": seconds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="N = 8 only")
    ap.add_argument("--search-seconds", type=float, default=60.0,
                    help="wall time of the 7B search on each cluster (0: no search)")
    args = ap.parse_args()
    sizes = (8,) if args.quick else (8, 64)
    t = time.perf_counter()
    # units="blocks": one unit per transformer block, as FSDP wraps them (one all-gather each)
    g = memflow.zoo.graph("gpt2-xl", batch_size=64, seq_len=1024, units="blocks")
    capture = time.perf_counter() - t
    psi = float(g.units["trainable_bytes"].sum()) / 4
    df = pd.DataFrame([r for n in sizes for r in rows(g, n)])
    print(df.to_string(index=False))
    worst = float(df["error %"].abs().max())
    t = time.perf_counter()
    llama = memflow.zoo.graph("llama2-7b", batch_size=BATCH, seq_len=SEQ, units="blocks",
                              backend="cuda")
    llama_capture = time.perf_counter() - t
    seven = pd.DataFrame([r for n in sizes for r in llama_rows(llama, n, args.search_seconds)])
    print(seven.to_string(index=False))
    zero = seven[seven["ZeRO formula (GiB)"] == seven["ZeRO formula (GiB)"]]
    worst7 = float((zero["model states (GiB)"] / zero["ZeRO formula (GiB)"] - 1).abs().max()) * 100
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
            "80 GB whatever the sharding; this table checks the model states."
            f"\n\n### Llama-2-7B, sequence {SEQ}, global batch {BATCH}\n\n"
            f"`llama2-7b` (Ψ = {float(llama.units['trainable_bytes'].sum()) / 4e9:.3f} B, "
            f"{len(llama)} units, one per decoder block; capture {llama_capture:.0f} s, CUDA "
            "saved-tensor rules: flash attention keeps its log-sum-exp, not the scores), bf16 "
            "parameters and 2-byte activations, fp32 master weights and Adam moments. "
            "DP and ZeRO rows run each GPU's sequences as micro-batches of one (gradient "
            "accumulation); TP×PP is `Strategy.tensor_parallel` (1F1B, each replica's "
            "sequences as micro-batches of one); the search (`MCMCSearch`, default moves, shard levels "
            f"included, {args.search_seconds:.0f} s of wall time each) starts from the fastest "
            "strategy that fits. In the full space (`runnable=False`) it keeps that start, so "
            "it is never worse. In the export space (the default) it starts from the fastest "
            "fitting row that export runs (`memflow.strategy.runnable.unrunnable`): DP and ZeRO "
            "rows run (one-stage 1F1B is gradient accumulation, `memflow.export.accumulation`); "
            "the column 'export runs' says which others do, and export's reason for each "
            "row it refuses is listed below the table; where a refused row is the "
            "fastest the export-space search can end slower than it. Model states per GPU "
            "(`SimResult.model_states`, the largest GPU) against ZeRO's formulas and "
            "DeepSpeed's estimators (no offload; stage 2: 4Ψ + 16Ψ/N, stage 3: 4·largest layer "
            "+ 18Ψ/N — DeepSpeed keeps fp32 gradients beside the 16-bit ones and charges the "
            "largest layer's gathered 16-bit weights and gradients); formulas only for "
            f"strategies without tensor parallelism or pipeline stages. Worst error against ZeRO: {worst7:.3f}%."
            "\n\n" + table(seven) + "\n\n" + "".join(
                f"- {label}: {why}\n" for label, why in REFUSED.items())
            + "\nStep times are simulated, not measured. "
            "ZeRO-1 is charged as export runs it (DDP's all-reduce, then "
            "`ZeroRedundancyOptimizer` re-gathering the updated parameters): 1.5 times DDP's "
            "bytes, hence slower than DDP on 64 GPUs; DeepSpeed's stage 1 reduce-scatters "
            "instead, DDP's volume. The "
            "simulator charges a tensor-parallel unit an all-reduce each way (a Megatron pair "
            "runs one per pair), so TP rows are pessimistic. The machine was loaded (shared, "
            "two cores, several agents): `sim (s)` timings are noisy, simulated times are not.")
    write_section("bench_sharding", body,
                  title="Sharded model states (ZeRO-1/2/3) on gpt2-xl and Llama-2-7B")


if __name__ == "__main__":
    main()
