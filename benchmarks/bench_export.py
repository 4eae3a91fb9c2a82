"""Exported strategies measured against memflow's memory model.

CPU (always): for every zoo model (shrunk to run in a fraction of a second) and the foundation
issue's varied real models, six strategies — keep everything, recompute everything, offload
everything, selective recomputation everywhere, and two seeded random mixes of keep /
recompute / offload — are exported with
``memflow.export.apply`` and run for real; ``memflow.export.validate`` compares the bytes held
for backward at the end of the forward (and the bytes offloaded to the host) with the memory
model's prediction. A recompute segment that saves nothing (a residual add alone) holds
nothing, in PyTorch's checkpoint, in the memory model and in the exported model alike.

GPU (when ``torch.cuda.is_available()``): resnet50 (batch 32, 224²) and gpt2 (batch 8 × 1024)
under three strategies — keep, recompute every block, and offload the first half of the blocks
while recomputing the second — peak memory of a training step measured with
``torch.cuda.max_memory_allocated`` against ``memflow.estimate``.

Run: ``python benchmarks/bench_export.py`` (``--quick`` for three models).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "tests" / "export")]

from _results import table, write_section  # noqa: E402
from models import captured, mixed, real_cases  # noqa: E402

import memflow  # noqa: E402
from memflow.export import ExportError, validate  # noqa: E402
from memflow.strategy import Strategy  # noqa: E402


def cpu_rows(names: list[str]) -> tuple[pd.DataFrame, list[str]]:
    """The table, and the strategies export refused (model, strategy: its reason)."""
    rows, refused = [], []
    for name in names:
        model, inputs, graph = captured(name)
        raw = Strategy.single_device(graph)
        strategies = {
            "keep": raw,
            "recompute all": mixed(graph, policies=("recompute",)),
            "offload all": mixed(graph, policies=("offload",)),
            "selective all": mixed(graph, policies=("selective",)),
            "mix": mixed(graph, seed=0),
            "mix (seed 1)": mixed(graph, seed=1),
        }
        for label, s in strategies.items():
            start = time.perf_counter()
            try:
                t = validate(model, inputs, s, graph)
            except ExportError as exc:
                refused.append(f"{name}, {label}: {exc}")
                continue
            rows.append({
                "model": name, "units": len(graph), "strategy": label,
                "saved predicted": int(t.loc["saved_bytes", "predicted"]),
                "saved measured": int(t.loc["saved_bytes", "measured"]),
                "saved error %": 100 * float(t.loc["saved_bytes", "error"]),
                "host predicted": int(t.loc["offloaded_bytes", "predicted"]),
                "host measured": int(t.loc["offloaded_bytes", "measured"]),
                "seconds": time.perf_counter() - start})
        print(name, "done", flush=True)
    return pd.DataFrame(rows).set_index("model"), refused


def gpu_rows() -> pd.DataFrame:
    rows = []
    for name, batch, cfg in (("resnet50", 32, {}), ("gpt2", 8, {"seq_len": 1024})):
        graph = memflow.zoo.graph(name, batch, units="blocks", backend="cuda", **cfg)
        model, inputs = memflow.zoo.get(name, batch, device="cuda", **cfg)
        blocks = [u for u in graph.names if graph.units.at[u, "role"] == "module"
                  and graph.units.at[u, "kind"] in ("Bottleneck", "Block")]
        half = len(blocks) // 2
        base = Strategy.single_device(graph)
        for label, s in (("keep", base),
                         ("recompute blocks", base.with_policy(recompute=blocks)),
                         ("offload ½, recompute ½", base.with_policy(
                             offload=blocks[:half], recompute=blocks[half:]))):
            t = validate(model, inputs, s, graph, devices={"gpu0": "cuda"})
            rows.append({"model": name, "batch": batch, "strategy": label,
                         "peak predicted GiB": t.loc["peak_bytes", "predicted"] / 2**30,
                         "peak measured GiB": t.loc["peak_bytes", "measured"] / 2**30,
                         "peak error %": 100 * float(t.loc["peak_bytes", "error"]),
                         "saved error %": 100 * float(t.loc["saved_bytes", "error"])})
            torch.cuda.empty_cache()
    return pd.DataFrame(rows).set_index("model")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="three models only")
    args = parser.parse_args()
    torch.set_num_threads(1)
    names = (["gpt2", "resnet50", "hf-bert"] if args.quick
             else memflow.zoo.names() + sorted(real_cases()))
    cpu, refused = cpu_rows(names)
    print(cpu.to_string())
    print("\n".join(refused))
    body = ("Bytes held for backward at the end of the forward, predicted by memflow's memory "
            "model and measured on the exported model (CPU, real tensors).\n\n"
            + table(cpu, floatfmt=".3g"))
    body += f"\n\nLargest |saved error|: {cpu['saved error %'].abs().max():.3g} %."
    body += "".join(f"\n\nRefused by export (named, before running): {r}" for r in refused)
    if torch.cuda.is_available():
        gpu = gpu_rows()
        print(gpu.to_string())
        body += ("\n\nPeak memory of a training step on " + torch.cuda.get_device_name()
                 + " (SGD):\n\n" + table(gpu, floatfmt=".3g"))
    else:
        body += ("\n\nNo CUDA GPU here: the peak-memory table (resnet50 and gpt2 under three "
                 "strategies, `torch.cuda.max_memory_allocated` against `memflow.estimate`) "
                 "runs when `torch.cuda.is_available()`; `bench_gpu.py` measured a GPU "
                 "(section 'gpu').")
    write_section("export", body, title="Export: predicted against measured memory")


if __name__ == "__main__":
    main()
