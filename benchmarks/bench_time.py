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

The machine is shared: another process's load changes the measured time but not the
prediction. So the compute figures (matmul, convolution, copy bandwidth, dispatch) are
measured again right before each row (the gloo all-reduce figures come from the cache), and
each row is run ``--repeat`` times; the table gives the median ratio measured / predicted and
the spread. The load average is printed with each row.

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
from memflow._jsonio import read_json  # noqa: E402
from memflow.hardware.local import cache_file, local, local_cluster, measure  # noqa: E402

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


def row(model: str, kind: str, processes: int, repeat: int, cached: dict,
        calibrated: bool = False) -> dict:
    options, batch = MODELS[model]
    ratios, predicted, measured, loads, again = [], [], [], [], []
    graph = memflow.zoo.graph(model, batch_size=batch, units="blocks", **options)
    for _ in range(repeat):
        figures = measure(collectives=False)           # this moment's compute rates
        figures["allreduce"] = cached["allreduce"]
        cluster = local_cluster(figures, processes)
        s = strategy(graph, kind, processes, cluster)
        r = step_time(s, model, cluster, model_options=options, batch_size=batch, graph=graph)
        if calibrated:
            fitted = calibrate(unit_times(model, graph), cluster)
            again.append(memflow.simulate(graph, s, fitted).iteration_time)
        predicted.append(float(r["predicted"].iloc[0]))
        measured.append(float(r["measured"].iloc[0]))
        ratios.append(measured[-1] / predicted[-1])
        loads.append(os.getloadavg()[0])
    out = {"model": model, "strategy": kind, "processes": processes,
           "predicted (ms)": 1e3 * statistics.median(predicted),
           "measured (ms)": 1e3 * statistics.median(measured),
           "measured / predicted": statistics.median(ratios),
           "spread": max(ratios) - min(ratios), "load": statistics.median(loads)}
    if calibrated:
        out["measured / calibrated"] = statistics.median(
            m / a for m, a in zip(measured, again))
    print(", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                    for k, v in out.items()), flush=True)
    return out


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
    local(2)                                  # measures (and caches) once if need be
    figures = read_json(cache_file())
    started = time.time()
    rows = []
    for model in models:
        cases = [(k, 1) for k in SINGLE] + [("keep", 2)] + ([] if args.quick else [("keep", 4)])
        for kind, n in cases:
            rows.append(row(model, kind, n, args.repeat, figures, args.calibrate))
    df = pd.DataFrame(rows)
    err = (df["measured / predicted"] - 1).abs()
    worst = df.loc[err.idxmax()]
    within = int((err <= 0.15).sum())
    body = (
        f"Predicted (`memflow.simulate` on `Cluster.local(n)`, compute figures re-measured "
        f"before each row) against measured (the exported script's median step after "
        f"{memflow.export.timing.WARMUP} warm-up steps, {memflow.export.timing.STEPS} timed) "
        f"step time; every process runs one thread (`OMP_NUM_THREADS=1`); "
        f"{args.repeat} run(s) per row, ratio = median of measured / predicted. "
        f"All-reduce figures from `Cluster.local()`'s cache: "
        f"{figures['allreduce']['bandwidth'] / 1e9:.3g} GB/s, "
        f"{figures['allreduce']['latency'] * 1e6:.0f} µs.\n\n"
        f"**{within} of {len(df)} rows within 15%; worst: {worst['model']} {worst['strategy']} "
        f"x{worst['processes']}, measured/predicted {worst['measured / predicted']:.2f}.** "
        f"The machine is shared (load average column: other jobs on its "
        f"{os.cpu_count()} cores), so measured times swing with it; the figures re-measured "
        f"before each row follow part of that swing, not all. Ran in "
        f"{time.time() - started:.0f} s.\n\n" + table(df, ".3g"))
    if not args.no_write:
        write_section("step_time", body, title="Step time: predicted vs measured (CPU)")
    print(body)


if __name__ == "__main__":
    main()
