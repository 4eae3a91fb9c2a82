"""Predicted against measured step time on this machine's CPU (issue 18, item 3).

For a few zoo models, shrunk to take a fraction of a second per step, strategies are exported
as training scripts and run for real (``memflow.export.timing.step_time``): single process
``keep``, ``recompute`` (every block), ``offload`` (every block but the last) and ``compress``
(every block but the last, error bound 1e-2), and data parallelism over 2 and 4 processes
(``torchrun``, gloo). The prediction is ``memflow.simulate`` on ``Cluster.local(n)``.

Every process runs one thread (``OMP_NUM_THREADS=1``, set here for the scripts too, as
``torchrun`` does for several processes): on this loaded 2-core machine a two-thread step runs
about ten times slower than a one-thread one (OpenMP threads wait for each other on busy
cores), which would measure the other jobs rather than memflow.

The machine is shared: another process's load changes a step's wall time but not the
prediction. So a one-process row is compared by CPU time: the exported script records each
step's ``time.process_time`` beside its wall time, and the prediction runs on
``Cluster.local(clock="cpu")``, whose micro-benchmark figures are timed by CPU time too. The
wall-clock comparison is printed beside it. The figures are measured again just before each
row, so that a row and its figures see the same load (the gloo all-reduce figures come from
the cache). Several processes (gloo)
wait for each other, so those rows are compared by wall time only, in their own table: they
follow the load. Each row is run ``--repeat`` times; the table gives the median ratio
measured / predicted, the spread and the load average.

Run: ``python benchmarks/bench_time.py`` (``--quick``: two models, single process and 2
processes only; ``--repeat 3`` to repeat every row).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks")]

from _results import table, write_section  # noqa: E402

import memflow  # noqa: E402
from memflow.export.timing import step_time  # noqa: E402
from memflow.hardware import calibrate  # noqa: E402
from memflow._jsonio import read_json, write_json  # noqa: E402
from memflow.hardware.local import FORMAT, cache_file, local, local_cluster, measure  # noqa: E402

# name -> (zoo options, batch): each a fraction of a second per step on 2 loaded cores
MODELS = {
    "mlp": ({"width": 512}, 32),
    "resnet50": ({"width": 16, "image_size": 64}, 8),
    "gpt2": ({"n_layer": 2, "hidden": 128, "n_head": 4, "vocab": 1000, "seq_len": 64}, 8),
}
SINGLE = ("keep", "recompute", "offload", "compress")


def strategy(graph, kind: str, processes: int, cluster):
    s = memflow.Strategy.data_parallel(graph, list(cluster.devices.index))
    blocks = graph.names[:-1] if len(graph.names) > 1 else graph.names
    if kind == "recompute":
        s = s.with_policy(recompute=graph.names)
    elif kind == "offload":
        s = s.with_policy(offload=blocks)
    elif kind == "compress":
        s = s.with_policy({u: "compress:0.01" for u in blocks})
    return s


def unit_times(model: str, graph, reps: int = 5) -> pd.DataFrame:
    """Measured op times for ``memflow.hardware.calibrate``: each module unit's forward, timed
    with module hooks on the real model (median of ``reps`` forwards), beside its FLOPs,
    bytes and kernels from the graph."""
    options, batch = MODELS[model]
    net, inputs = memflow.zoo.get(model, batch, device="cpu", **options)
    modules = dict(net.named_modules())
    seconds: dict[str, list[float]] = {u: [] for u in graph.names if u in modules}
    start: dict[str, float] = {}
    hooks = []
    for u in seconds:
        hooks.append(modules[u].register_forward_pre_hook(
            lambda m, a, u=u: start.__setitem__(u, time.perf_counter())))
        hooks.append(modules[u].register_forward_hook(
            lambda m, a, o, u=u: seconds[u].append(time.perf_counter() - start[u])))
    with torch.no_grad():
        for _ in range(reps + 1):
            net(*inputs)
    for h in hooks:
        h.remove()
    units = graph.units.set_index("unit") if "unit" in graph.units.columns else graph.units
    rows = units.loc[list(seconds), ["fwd_flops", "fwd_bytes_moved", "fwd_ops"]]
    rows.columns = ["flops", "bytes_moved", "ops"]
    rows["seconds"] = [statistics.median(v[1:]) for v in seconds.values()]
    return rows


def row(model: str, kind: str, processes: int, repeat: int, figures: dict,
        calibrated: bool = False) -> dict:
    """One table row: ``repeat`` runs of the exported script, against the prediction by CPU
    time (one process) and by wall time."""
    options, batch = MODELS[model]
    graph = memflow.zoo.graph(model, batch_size=batch, units="blocks", **options)
    walls = {"wall": local_cluster(figures, processes, threads=1)}
    clusters = walls | ({"cpu": local_cluster(figures, 1, threads=1, clock="cpu")}
                        if processes == 1 else {})
    runs: dict[str, list[tuple[float, float]]] = {c: [] for c in clusters}
    loads, again = [], []
    for _ in range(repeat):
        s = strategy(graph, kind, processes, clusters["wall"])
        r = step_time(s, model, clusters["wall"], model_options=options, batch_size=batch,
                      graph=graph)
        loads.append(os.getloadavg()[0])
        for clock, cluster in clusters.items():
            predicted = memflow.simulate(graph, s, cluster).iteration_time
            runs[clock].append((predicted, statistics.median(r.attrs[f"{clock}_times"])))
        if calibrated:
            fitted = calibrate(unit_times(model, graph), clusters["wall"])
            again.append(runs["wall"][-1][1] / memflow.simulate(graph, s, fitted).iteration_time)
    out: dict = {"model": model, "strategy": kind, "processes": processes}
    for clock, pairs in runs.items():
        ratios = [m / p for p, m in pairs]
        name = "CPU time" if clock == "cpu" else "wall"
        out |= {f"{name}: predicted (ms)": 1e3 * statistics.median(p for p, _ in pairs),
                f"{name}: measured (ms)": 1e3 * statistics.median(m for _, m in pairs),
                f"{name}: measured / predicted": statistics.median(ratios),
                f"{name}: spread": max(ratios) - min(ratios)}
    out["load"] = statistics.median(loads)
    out["load (figures)"] = figures["load"]
    if calibrated:
        out["wall: measured / calibrated"] = statistics.median(again)
    print(", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                    for k, v in out.items()), flush=True)
    return out


def summary(df: pd.DataFrame, clock: str) -> str:
    ratio = df[f"{clock}: measured / predicted"]
    err = (ratio - 1).abs()
    worst = df.loc[err.idxmax()]
    return (f"{int((err <= 0.15).sum())} of {len(df)} rows within 15% by {clock}; worst: "
            f"{worst['model']} {worst['strategy']} x{worst['processes']}, measured/predicted "
            f"{ratio[err.idxmax()]:.2f}; median {ratio.median():.2f}")


def main(argv: list[str] | None = None) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--models", nargs="*", default=None)
    p.add_argument("--calibrate", action="store_true",
                   help="also predict on the cluster calibrated to measured unit times")
    p.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md")
    args = p.parse_args(argv)
    models = args.models or (["mlp", "gpt2"] if args.quick else list(MODELS))
    started, load0 = time.time(), os.getloadavg()[0]
    cached = read_json(cache_file()) if cache_file().is_file() else {}
    if "allreduce" not in cached or cached.get("format") != FORMAT:
        local(2, remeasure=True)              # measures (and caches) the all-reduce
        cached = read_json(cache_file())
    rows, first = [], None
    for model in models:
        cases = [(k, 1) for k in SINGLE] + [("keep", 2)] + ([] if args.quick else [("keep", 4)])
        for kind, n in cases:
            # the figures again just before each row, so that both see the same load: on
            # this machine it moves CPU time too (the two vCPUs share a core's caches), and
            # only the ratio of a row to its figures means anything
            figures = measure(collectives=False) | {"allreduce": cached["allreduce"]}
            figures["load"] = os.getloadavg()[0]
            write_json(cache_file(), figures)      # this run's figures, for Cluster.local()
            first = first or figures
            rows.append(row(model, kind, n, args.repeat, figures, args.calibrate))
    df = pd.DataFrame(rows)
    one = df[df["processes"] == 1].reset_index(drop=True)
    several = df[df["processes"] > 1].dropna(axis=1).reset_index(drop=True)
    cpu = {k: v["cpu"] for k, v in first.items() if isinstance(v, dict) and "cpu" in v}
    body = (
        f"Predicted (`memflow.simulate` on `Cluster.local`) against measured (the exported "
        f"script's median step after {memflow.export.timing.WARMUP} warm-up steps, "
        f"{memflow.export.timing.STEPS} timed) step time; every process runs one thread "
        f"(`OMP_NUM_THREADS=1`); {args.repeat} run(s) per row, ratio = median of measured / "
        f"predicted. The figures were measured again just before each row (their load "
        f"beside the row's own); the first row's (load {first['load']:.1f}), one-thread "
        f"CPU-time figures: matmul {cpu['matmul_flops'] / 1e9:.3g} GFLOP/s "
        f"(backward {cpu['matmul_backward_flops'] / 1e9:.3g}), convolution "
        f"{cpu['conv_flops'] / 1e9:.3g} (backward {cpu['conv_backward_flops'] / 1e9:.3g}), "
        f"element-wise {cpu['elementwise_bandwidth'] / 1e9:.3g} GB/s, copy "
        f"{cpu['copy_bandwidth'] / 1e9:.3g} GB/s, {cpu['op_overhead'] * 1e6:.2g} µs per op "
        f"forward, {cpu['backward_op_overhead'] * 1e6:.2g} µs per autograd node, "
        f"{cpu['optimizer_overhead'] * 1e6:.2g} µs per parameter tensor in the optimizer, "
        f"{cpu['hook_overhead'] * 1e6:.2g} µs per saved tensor through a Python hook, "
        f"{cpu['offload_bandwidth'] / 1e9:.3g} GB/s into new host images; "
        f"all-reduce (cached) {first['allreduce']['bandwidth'] / 1e9:.3g} GB/s, "
        f"{first['allreduce']['latency'] * 1e6:.0f} µs. Ran in "
        f"{time.time() - started:.0f} s (load {load0:.1f} at the start).\n\n"
        f"**One process, by CPU time: {summary(one, 'CPU time')}.** The prediction on "
        f"`Cluster.local(clock=\"cpu\")` (figures timed by the process's CPU time) against "
        f"the step's CPU time (`time.process_time`): another job's load moves both less than "
        f"wall time, not nothing (the cores share caches). "
        f"The same rows by wall time (figures and steps by the wall clock): "
        f"{summary(one, 'wall')}.\n\n" + table(one, ".3g") + "\n\n"
        f"**Several processes (gloo), by wall time: {summary(several, 'wall')}.** A process "
        f"waits for the others at every all-reduce, so only wall time means anything here, "
        f"and it moves with the other jobs' load on the {os.cpu_count()} shared cores.\n\n"
        + table(several, ".3g"))
    if not args.no_write:
        write_section("step_time", body, title="Step time: predicted vs measured (CPU)")
    print(body)


if __name__ == "__main__":
    main()
