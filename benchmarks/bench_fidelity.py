"""Training-step peaks against PyTorch's MemTracker: Hugging Face models and zoo models, at
several unit granularities and under plans run through export (issue 18 item 2).

Each row is one real CPU step (forward, ``loss_fn(output)`` with the output dropped, backward,
``optimizer.step()``, ``zero_grad(set_to_none=True)``; the second step, so the optimizer state
exists) measured by MemTracker, against ``memflow.estimate`` of the graph captured from the
same model and inputs. Optimizers: SGD with momentum, AdamW (memflow's ``adam`` states).
Plans (``--plans``, on ``blocks`` units): every unit under ``recompute``, ``selective``,
``offload`` or ``compress:0.01``, or ``offload:knapsack`` — the offload planner's knapsack
(:func:`memflow.planners.offload`) for a V100 whose memory is halfway between what
offloading every unit and offloading none peak at there, some units kept and some offloaded
—, applied by ``memflow.export.apply`` and measured on the exported model; under
``compress`` the estimate charges the ratios the compressor reaches on the model's own maps,
measured before the run on its weights as built
(:func:`memflow.planners.compress_measure.map_bits`). On a CPU the host is the device's
memory: MemTracker counts offloaded host images with everything else, and so does the
estimate (``docs/data-model.md``, ``offload``).
Target: within 1%.

    python benchmarks/bench_fidelity.py                       # everything
    python benchmarks/bench_fidelity.py --models llama gpt2   # some models
    python benchmarks/bench_fidelity.py --plans-for llama     # plans on llama only
    python benchmarks/bench_fidelity.py --models llama gpt2 --plans selective --no-keep
        # a row filter: only these rows run; the section keeps every other row it had
"""
from __future__ import annotations

import argparse
import io
import re
import sys
import time
from pathlib import Path

import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "tests" / "graph"), str(ROOT)]

import memflow  # noqa: E402
from memflow.export import apply  # noqa: E402
from memflow.memory.measure import memtracker_peak  # noqa: E402
from memflow.planners import offload  # noqa: E402
from memflow.planners.compress_measure import map_bits  # noqa: E402
from memflow.strategy import Strategy  # noqa: E402
from _results import RESULTS, table, write_section  # noqa: E402
from bench_estimate import SHRUNK  # noqa: E402
from hf_models import HF_MODELS  # noqa: E402

OPTIMIZERS = {"momentum": "momentum", "adamw": "adam"}   # measured -> estimated as
GRANULARITIES = ("leaves", "blocks", 2)
PLANS = ("recompute", "selective", "offload", "offload:knapsack", "compress:0.01")
PLANNER_GPU = memflow.Cluster.preset("1xV100-16GB")


def build(name: str):
    """``(model, inputs, loss_fn)``: a Hugging Face model, or a shrunk zoo model (sum loss)."""
    torch.manual_seed(0)
    if name in HF_MODELS:
        return HF_MODELS[name]()
    model, inputs = memflow.zoo.get(name, device="cpu", **SHRUNK[name])
    return model, inputs, None


def planned_offload(graph) -> Strategy:
    """The offload planner's knapsack plan on :data:`PLANNER_GPU`, its memory halfway between
    the simulated peaks of offloading every unit and none."""
    peak = {p: memflow.simulate(graph, offload(graph, PLANNER_GPU, p, memory_limit=1e18),
                                PLANNER_GPU).peak_memory.max() for p in ("all", "none")}
    return offload(graph, PLANNER_GPU, "knapsack", memory_limit=(peak["all"] + peak["none"]) / 2)


def row(name: str, units, plan: str, optimizer: str) -> dict:
    start = time.perf_counter()
    model, inputs, loss_fn = build(name)
    graph = memflow.from_torch(model, inputs, units=units, loss_fn=loss_fn)
    strategy = Strategy.single_device(graph)
    if plan != "keep":
        if plan.startswith("compress:"):    # the model's own maps' ratios, before the run
            graph.meta["map_bits"] = map_bits(model, inputs, error_bounds=[float(plan[9:])])
        body = [u for u in graph.names if u != "<loss>"]
        strategy = planned_offload(graph) if plan == "offload:knapsack" else \
            strategy.with_policy({u: plan for u in body})
        model = apply(model, strategy, graph, devices={"gpu0": "cpu"})
    measured = memtracker_peak(model, inputs, optimizer=optimizer, loss_fn=loss_fn)["Total"]
    est = memflow.estimate(graph, "cpu", optimizer=OPTIMIZERS[optimizer], strategy=strategy)
    predicted = float(est.loc["total", "at_peak"])
    return {"model": name, "units": str(units), "n": len(graph), "plan": plan,
            "offloaded units": strategy.policies.count("offload"),
            "optimizer": optimizer, "MemTracker MiB": measured / 2 ** 20,
            "estimate MiB": predicted / 2 ** 20, "error %": 100 * (predicted / measured - 1),
            "estimate peak at": est.attrs["peak_task"], "s": time.perf_counter() - start}


KEY = ["model", "units", "plan", "optimizer"]


def previous_rows() -> pd.DataFrame:
    """The rows of the section as RESULTS.md has it (none when it has no section)."""
    text = RESULTS.read_text() if RESULTS.exists() else ""
    found = re.search(r"<!-- begin fidelity -->(.*?)<!-- end fidelity -->", text, re.S)
    lines = [ln for ln in (found.group(1).splitlines() if found else [])
             if ln.startswith("|") and not ln.startswith("|---")]
    if not lines:
        return pd.DataFrame()
    df = pd.read_csv(io.StringIO("\n".join(ln.strip().strip("|") for ln in lines)), sep="|")
    df.columns = [c.strip() for c in df.columns]
    return df.map(lambda v: v.strip() if isinstance(v, str) else v).astype({"units": str})


def offload_note(df: pd.DataFrame) -> str:
    """What the offload rows compare, and how close they come."""
    off = df[df["plan"].str.startswith("offload")]
    if not len(off):
        return ""
    w = off.loc[off["error %"].abs().idxmax()]
    return (
        "\n\nUnder `offload` on a CPU the host is the device's memory: MemTracker counts the "
        "host images export's offload hook makes with everything else the step holds, and "
        "`memflow.estimate(..., \"cpu\")` counts them in the same memory (`docs/data-model.md`, "
        "`offload`: a storage goes when its forward readers are done, its image is there from "
        "the unit's offload task, backward reads it in place). "
        f"Offload rows: {int((off['error %'].abs() <= 1).sum())} of {len(off)} within 1%, "
        f"|error| max {abs(w['error %']):.2f}% ({w['model']} {w['plan']} {w['optimizer']}). "
        "Where every unit offloads and the step peaks before the backward of the unit that "
        "saves a floating input, rows read below their keep rows by twice that input "
        "(inception_v3: 2 × 2.05 MiB, -0.45% against +0.45% kept; whisper: 2 × 8 KiB of "
        "features, -0.62%; mlp, chain, alexnet: -0.10% to -0.21%): MemTracker counts a "
        "storage only once an op outputs it, so the caller's input, never counted while "
        "kept, is counted from the moment the offload hook detaches it to copy it, beside "
        "its image, which the estimate counts. GPT-2's -0.25% (3.6 KiB over its keep row) "
        "is not that (its inputs are 256-byte token ids): not traced further.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # a zoo model named as a Hugging Face one (gpt2) is built as that one (``build``): once
    models = sorted(HF_MODELS) + [m for m in SHRUNK if m not in HF_MODELS]
    ap.add_argument("--models", nargs="+", default=models,
                    help="models to run (a row filter unless every model: the section keeps "
                         "the other models' rows)")
    ap.add_argument("--plans-for", nargs="*", default=None,
                    help="models that also run the plans (default: every model)")
    ap.add_argument("--plans", nargs="+", default=list(PLANS), choices=PLANS,
                    help="plans to run (a row filter: the section keeps its other rows)")
    ap.add_argument("--no-keep", action="store_true",
                    help="run no keep rows (a row filter: the section keeps its other rows)")
    args = ap.parse_args()
    filtered = args.no_keep or set(args.plans) != set(PLANS) or set(args.models) != set(models)
    torch.set_num_threads(1)
    rows, failed = [], []
    for name in args.models:
        cases = [] if args.no_keep else [(g, "keep") for g in GRANULARITIES]
        if args.plans_for is None or name in args.plans_for:
            cases += [("blocks", p) for p in args.plans]
        for units, plan in cases:
            for opt in OPTIMIZERS:
                try:
                    rows.append(row(name, units, plan, opt))
                    print({k: (round(v, 3) if isinstance(v, float) else v)
                           for k, v in rows[-1].items()}, flush=True)
                except Exception as exc:   # export refusals and tool failures: reported
                    failed.append(f"{name}, {units}, {plan}, {opt}: {type(exc).__name__}: "
                                  f"{str(exc)[:160]}")
                    print(failed[-1], flush=True)
    df = pd.DataFrame(rows).drop(columns=["s"])
    note = ""
    if filtered:        # the rows run replace theirs; the others stay as the section had them
        old = previous_rows()
        if len(old):        # in the section's order, new rows last
            new = {tuple(r): i for i, r in enumerate(df[KEY].astype(str).to_numpy())}
            keys = [tuple(r) for r in old[KEY].astype(str).to_numpy()]
            note = (f" Rows re-run now: {len(df)} (this command); the other "
                    f"{sum(k not in new for k in keys)} are from the section's previous run.")
            df = pd.concat([df.iloc[[new[k]]] if k in new else old.iloc[[i]]
                            for i, k in enumerate(keys)]
                           + [df.iloc[[i]] for k, i in new.items() if k not in set(keys)],
                           ignore_index=True)
    # rows from before the column: plans that offload nothing
    df.insert(4, "offloaded units", df.pop("offloaded units").fillna(0).astype(int))
    w = df.loc[df["error %"].abs().idxmax()]
    within = int((df["error %"].abs() <= 1).sum())
    body = (f"{within} of {len(df)} rows within 1% (|error| max {abs(w['error %']):.2f}%, mean "
            f"{df['error %'].abs().mean():.2f}%). Worst row: {w['model']} {w['units']} "
            f"{w['plan']} {w['optimizer']} {w['error %']:+.2f}%. Memory figures do not "
            f"depend on the machine's load.{note}{offload_note(df)}\n\n"
            + table(df.set_index("model"), floatfmt=".4g"))
    body += "".join(f"\n\nNot run: {f}" for f in failed)
    write_section("fidelity", body, title="Training-step peaks against MemTracker (CPU)")


if __name__ == "__main__":
    main()
