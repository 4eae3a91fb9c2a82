"""Predicted against measured on a CUDA GPU: a training step's time and peak memory (issue 18,
item 4).

Each case is a zoo model at a batch that keeps the GPU busy, captured with CUDA's saved-tensor
rules (``backend="cuda"``), one unit per block, with the loss the exported script computes
(``memflow.export.capture_loss``: cross entropy over the logits). Each strategy is exported as
a training script and run for real on the GPU (``memflow.export.timing.measured_step_times``: 3 warm-up steps, then
5 timed ones, each ending in a CUDA synchronisation, by the wall clock), which also records
``torch.cuda.max_memory_allocated`` and ``max_memory_reserved`` over the whole run. Against
them:

* ``time predicted``: ``memflow.simulate`` on the GPU's catalogue entry (``1xH100-80GB`` or
  the H200's) — datasheet peaks and the time model's efficiency constants, nothing measured
  on this machine;
* ``peak predicted``: ``memflow.estimate(graph, "cuda", ...)``, every tensor at its bytes, and
  ``peak (blocks)`` with ``allocator="cuda"`` (each tensor charged the caching allocator's
  512-byte block, and cuBLAS's workspaces);
* ``reserved predicted``: the same estimate's replay of the step's allocations through the
  caching allocator's segments (``memflow.memory.allocator``), against ``memory_reserved``.

Each model's units are also timed alone (forwards under ``no_grad``, CUDA events at module
hooks, median of 5) and ``memflow.hardware.calibrate`` fits the GPU's efficiencies and launch
overhead to *the other models'* unit times: ``time calibrated`` is the step predicted on that
calibrated cluster (leave one model out, so no row is predicted from its own measurements).

Where no GPU is here the script says why and writes nothing. ``--dry`` runs the same code on
the CPU at toy sizes (no CUDA figures), to check the script before a GPU is lent.

Run: ``python benchmarks/bench_gpu.py`` (``--quick``: one model; ``--rows FILE``: each row is
also appended to FILE as a JSON line as soon as it is measured, the units' times beside it).
``--repredict FILE`` needs no GPU: it predicts a GPU run's measured rows again with this
memflow and writes the section (the H200 runs are kept in ``benchmarks/gpu/``).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks")]

from _results import table, write_section  # noqa: E402
from _unit_times import unit_times  # noqa: E402

import memflow  # noqa: E402
from memflow.export import capture_loss  # noqa: E402
from memflow.export.timing import gpu_problem, measured_step_times, step_seconds  # noqa: E402
from memflow.hardware import calibrate  # noqa: E402
from memflow.strategy import Strategy  # noqa: E402

# (zoo model, batch, model options, block kind, dry batch and options)
MODELS = {
    "resnet50": (64, {}, "Bottleneck", (2, {"image_size": 64})),
    "gpt2": (8, {"seq_len": 1024}, "Block", (2, {"seq_len": 32})),
    "tinyllama-1.1b": (4, {"seq_len": 1024}, "DecoderLayer", (1, {"seq_len": 32})),
}


def strategies(graph, kind: str) -> dict[str, tuple[Strategy, str]]:
    """Label -> (strategy, optimizer): keep, recompute every block (one segment), offload the
    first half of the blocks and recompute the second, selective recomputation of every block,
    amp, and keep under Adam."""
    blocks = [u for u in graph.names if graph.units.at[u, "role"] == "module"
              and graph.units.at[u, "kind"] == kind]
    half = len(blocks) // 2
    base = Strategy.single_device(graph)
    return {"keep": (base, "sgd"),
            "keep, adam": (base, "adam"),
            # consecutive recomputed units are one segment, replayed whole in backward
            "recompute blocks (one segment)": (base.with_policy(recompute=blocks), "sgd"),
            "offload ½, recompute ½": (base.with_policy(offload=blocks[:half],
                                                        recompute=blocks[half:]), "sgd"),
            "selective blocks": (base.with_policy(selective=blocks), "sgd"),
            "amp": (base.with_model_states(precision="amp"), "sgd")}


def gpu_cluster() -> memflow.Cluster:
    """The catalogue cluster of the GPU here (its first device is ``gpu0``)."""
    name = torch.cuda.get_device_name()
    for key, preset in (("H100", "1xH100-80GB"), ("H200", "8xH200-141GB"),
                        ("A100", "1xA100-80GB"), ("V100", "1xV100-16GB")):
        if key in name:
            return memflow.Cluster.preset(preset)
    raise SystemExit(f"bench_gpu: no catalogue entry for {name!r}; add one to "
                     "memflow.hardware.catalogue")


GIB = 2 ** 30
MEASURED = ("time measured ms", "peak measured GiB", "reserved measured GiB")


def predict(strategy: Strategy, optimizer: str, graph, cluster) -> dict:
    """The predicted columns: step time on ``cluster``, the peak at tensor bytes, and the peak
    and reserved bytes with the caching allocator modelled (``allocator="cuda"``)."""
    est = memflow.estimate(graph, "cuda", optimizer=optimizer, strategy=strategy)
    blocks = memflow.estimate(graph, "cuda", optimizer=optimizer, strategy=strategy,
                              allocator="cuda")
    step = memflow.simulate(graph, strategy, cluster, optimizer=optimizer).iteration_time
    return {"time predicted ms": 1e3 * float(step),
            "peak predicted GiB": est.attrs["peak"] / GIB,
            "peak (blocks) GiB": blocks.attrs["peak"] / GIB,
            "reserved predicted GiB": blocks.attrs["reserved"] / GIB}


def measure(name: str, strategy: Strategy, optimizer: str, graph, batch: int, cfg: dict,
            dry: bool) -> dict:
    """The measured columns: the exported script run on the GPU (the CPU with ``dry``), by
    the wall clock (:func:`predict` simulates the step)."""
    t = measured_step_times(strategy, name, model_options=cfg, batch_size=batch, graph=graph,
                            optimizer=optimizer, devices={"gpu0": "cpu"} if dry else None)
    allocated, reserved = t.get("peak_allocated"), t.get("peak_reserved")
    return {"time measured ms": 1e3 * step_seconds(t["wall"], "wall"),
            "peak measured GiB": allocated / GIB if allocated is not None else float("nan"),
            "reserved measured GiB": reserved / GIB if reserved is not None else float("nan")}


def compared(r: dict) -> dict:
    """``r`` with its ratio and error columns."""
    return {**r, "time ratio": r["time measured ms"] / r["time predicted ms"],
            "peak error %": 100 * (r["peak (blocks) GiB"] / r["peak measured GiB"] - 1),
            "reserved error %": 100 * (r["reserved predicted GiB"] / r["reserved measured GiB"]
                                       - 1)}


def workspaces() -> dict[str, int]:
    """Bytes the CUDA libraries take from the caching allocator beside the tensors, in a fresh
    process: cuBLAS's workspace kept after a first matrix product on this thread and after
    one in autograd's backward thread, and the peak above the tensors during a 3×3
    convolution's forward and backward (cuDNN's transient workspace)."""
    def held() -> int:
        torch.cuda.synchronize()
        return torch.cuda.memory_allocated()

    a = torch.randn(512, 512, device="cuda", requires_grad=True)
    base = held()
    with torch.no_grad():
        del_me = a @ a
    del del_me
    forward = held() - base
    (a @ a).sum().backward()
    backward = held() - base - forward - a.grad.nbytes
    conv = torch.nn.Conv2d(256, 256, 3, padding=1).cuda()
    x = torch.randn(32, 256, 56, 56, device="cuda", requires_grad=True)
    before = held()
    torch.cuda.reset_peak_memory_stats()
    y = conv(x)
    conv_fwd = torch.cuda.max_memory_allocated() - held()
    torch.cuda.reset_peak_memory_stats()
    y.sum().backward()
    conv_bwd = torch.cuda.max_memory_allocated() - held()
    del a, x, y, conv
    torch.cuda.empty_cache()
    return {"cublas forward thread": forward, "cublas autograd thread": backward,
            "conv forward transient": conv_fwd, "conv backward transient": conv_bwd,
            "before conv": before}


def capture(name: str, dry: bool):
    """(graph, batch, model options, block kind) of a case."""
    batch, cfg, kind, (dry_batch, dry_cfg) = MODELS[name]
    batch, cfg = (dry_batch, dry_cfg) if dry else (batch, cfg)
    start = time.perf_counter()
    graph = memflow.zoo.graph(name, batch, units="blocks", backend="cuda",
                              loss_fn=capture_loss(), **cfg)
    print(f"{name}: captured {len(graph)} units in {time.perf_counter() - start:.1f} s",
          flush=True)
    return graph, batch, cfg, kind


def run(args, cluster) -> tuple[list[dict], pd.DataFrame, dict, dict]:
    """Measure every case on the GPU: the rows, the units' forward times, the probe and the
    cases' graphs (:func:`capture`'s, by model)."""
    probe = {} if args.dry else workspaces()

    def log(record: dict) -> None:
        if args.rows:
            with open(args.rows, "a") as fh:
                fh.write(json.dumps(record) + "\n")

    log({"device": "cpu" if args.dry else torch.cuda.get_device_name(),
         "cluster": cluster.name, "torch": torch.__version__, "cuda": torch.version.cuda,
         "date": time.strftime("%Y-%m-%d %H:%M"), "workspaces": probe})
    rows, measured, graphs = [], [], {}
    for name in args.models or (["resnet50"] if args.quick else list(MODELS)):
        graph, batch, cfg, kind = capture(name, args.dry)
        graphs[name] = graph, batch, cfg, kind
        measured.append(unit_times(name, batch, cfg, graph, "cpu" if args.dry else "cuda")
                        .assign(model=name))
        for label, (strategy, optimizer) in strategies(graph, kind).items():
            if args.strategies and label not in args.strategies:
                continue
            r = {"model": name, "batch": batch, "strategy": label, "optimizer": optimizer}
            try:
                r.update(measure(name, strategy, optimizer, graph, batch, cfg, args.dry))
            except Exception as exc:        # a failed row is reported, the others still run
                r["failed"] = f"{type(exc).__name__}: {exc}"[:300]
            rows.append(r)
            print(json.dumps(r), flush=True)
            log(r)
    units = pd.concat(measured)
    if args.rows:
        units.to_csv(Path(args.rows).with_suffix(".units.csv"))
    return rows, units, probe, graphs


def predicted(rows: list[dict], units: pd.DataFrame, cluster, dry: bool = False,
              graphs: dict | None = None) -> pd.DataFrame:
    """The measured ``rows`` beside this memflow's predictions: on the catalogue's
    ``cluster``, and calibrated on the other models' unit times (leave one model out).
    ``graphs``: the cases already captured (:func:`run`'s), by model; the others are."""
    out, graphs = [], dict(graphs or {})
    for r in rows:
        if "failed" in r:
            out.append(r)
            continue
        name = r["model"]
        if name not in graphs:
            graphs[name] = capture(name, dry)
        graph, _, _, kind = graphs[name]
        strategy, optimizer = strategies(graph, kind)[r["strategy"]]
        row = compared({**r, **predict(strategy, optimizer, graph, cluster)})
        others = units[units["model"] != name]
        if len(others):
            fitted = calibrate(others, cluster, devices=["gpu0"])
            t = memflow.simulate(graph, strategy, fitted, optimizer=optimizer).iteration_time
            row["time calibrated ms"] = 1e3 * float(t)
            row["calibrated ratio"] = row["time measured ms"] / row["time calibrated ms"]
        out.append(row)
    return pd.DataFrame(out).set_index("model")


def report(df: pd.DataFrame, units: pd.DataFrame, header: dict, section: str,
           repredicted: bool) -> None:
    ok = df[df["failed"].isna()] if "failed" in df else df
    when = (f"measured {header['date']}; predicted by this memflow "
            f"{time.strftime('%Y-%m-%d %H:%M')} on the CPU from the measured rows"
            if repredicted else f"measured and predicted {header['date']}")
    body = (f"GPU: {header['device']} (torch {header['torch']}, CUDA {header['cuda']}); "
            f"predictions on the catalogue's `{header['cluster']}`; {when}.\n\n"
            + table(df, floatfmt=".4g")
            + f"\n\nWorst |peak error|: {ok['peak error %'].abs().max():.3g} %; worst "
            f"|reserved error|: {ok['reserved error %'].abs().max():.3g} %; measured/predicted "
            f"step time: median {ok['time ratio'].median():.3g}, range "
            f"{ok['time ratio'].min():.3g}–{ok['time ratio'].max():.3g}"
            + (f"; calibrated on the other models' unit times: median "
               f"{ok['calibrated ratio'].median():.3g}, range {ok['calibrated ratio'].min():.3g}"
               f"–{ok['calibrated ratio'].max():.3g}." if "calibrated ratio" in ok else ".")
            + "\n\nUnit forward times measured (the calibration's data), per model: "
            + ", ".join(f"{m} {len(u)} units, {1e3 * u['seconds'].sum():.3g} ms"
                        for m, u in units.groupby("model")) + ".")
    if header.get("workspaces"):
        body += ("\n\nThe CUDA libraries' own allocations (a fresh process, bytes): "
                 + ", ".join(f"{k} {v:,}" for k, v in header["workspaces"].items()
                             if k != "before conv") + ".")
    write_section(section, body, title="A training step on a CUDA GPU: predicted against "
                  "measured")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="resnet50 only")
    parser.add_argument("--dry", action="store_true", help="on the CPU, toy sizes, no CUDA")
    parser.add_argument("--rows", default=None, help="append each row to this JSON-lines file")
    parser.add_argument("--models", nargs="*", default=None, help="a subset of the models")
    parser.add_argument("--strategies", nargs="*", default=None, help="a subset of the labels")
    parser.add_argument("--section", default="gpu", help="RESULTS.md section to write")
    parser.add_argument("--repredict", default=None, metavar="ROWS",
                        help="no GPU needed: predict the rows a GPU run wrote (--rows) again "
                        "with this memflow, and write the section")
    args = parser.parse_args(argv)
    if args.repredict:
        lines = [json.loads(line) for line in Path(args.repredict).read_text().splitlines()]
        header = next(r for r in lines if "device" in r)
        rows = [r for r in lines if "model" in r]
        units = pd.read_csv(Path(args.repredict).with_suffix(".units.csv"), index_col=0)
        df = predicted(rows, units, memflow.Cluster.preset(header["cluster"]))
        print(df.to_string())
        report(df, units, header, args.section, repredicted=True)
        return
    problem = None if args.dry else gpu_problem(Strategy(["x"], devices=[("gpu0",)]))
    if problem:
        print(f"bench_gpu: nothing measured: {problem}")
        return
    cluster = memflow.Cluster.preset("1xH100-80GB") if args.dry else gpu_cluster()
    rows, units, probe, graphs = run(args, cluster)
    df = predicted(rows, units, cluster, args.dry, graphs)
    print(df.to_string())
    if not args.dry:
        report(df, units, {"device": torch.cuda.get_device_name(), "cluster": cluster.name,
                           "torch": torch.__version__, "cuda": torch.version.cuda,
                           "date": time.strftime("%Y-%m-%d %H:%M"), "workspaces": probe},
               args.section, repredicted=False)


if __name__ == "__main__":
    main()
