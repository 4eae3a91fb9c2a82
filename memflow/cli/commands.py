"""What each ``memflow`` subcommand does, given its parsed arguments.

Each function takes the ``argparse.Namespace`` of :func:`memflow.cli.parser` and prints for a
person; errors are :class:`~memflow.errors.MemflowError` and become one line in
:func:`memflow.cli.main`.

>>> import argparse
>>> zoo(argparse.Namespace())                                     # doctest: +ELLIPSIS
          family ...
name ...
resnet50 ...
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

import pandas as pd

from ..errors import MemflowError
from ..report.style import format_bytes
from .inputs import (load_cluster, load_graph, load_strategy, parse_options, parse_shape,
                     parse_units)
from .folder import DERIVED, FILES, PlanFolder, run_search

__all__ = ["search", "simulate", "export", "report", "zoo", "presets", "demo", "DEMO",
           "EXIT_STATUS", "INFEASIBLE", "shortfall"]

DEMO = {"model": "resnet50", "batch": 1024, "cluster": "4xV100-16GB"}
"""The demo's defaults: data parallel needs ~21 GiB per V100-16GB at this batch."""

DEMO_CPU_BATCH = 2
"""Samples per replica and micro-batch in the try-out training command that the demo and
``export`` print: small enough for a CPU."""


def _try_out_batch(strategy) -> int:
    from ..export import replicas
    return DEMO_CPU_BATCH * replicas(strategy) * strategy.microbatches


def _inputs(args: argparse.Namespace) -> dict[str, Any]:
    """The model arguments as plain data (also recorded in summary.json)."""
    return {"model": args.model, "batch": args.batch,
            "options": parse_options(getattr(args, "option", None)),
            "input_shape": (list(parse_shape(args.input_shape))
                            if getattr(args, "input_shape", None) else None),
            "units": parse_units(getattr(args, "units", "blocks")),
            "cluster": getattr(args, "cluster", None),
            "memory_limit": getattr(args, "memory_limit", None)}


def _graph(inputs: dict[str, Any]):
    graph = load_graph(inputs["model"], inputs["batch"], units=inputs["units"],
                       options=inputs["options"], input_shape=inputs["input_shape"])
    inputs["batch"] = graph.meta["batch_size"]     # the model's own when --batch is left out
    return graph


def _describe(result) -> str:
    worst = result.peak_memory.idxmax()
    fit = "fits" if result.feasible else "does NOT fit"
    peak, capacity = format_bytes(result.peak_memory[worst]), format_bytes(result.capacity[worst])
    return (f"{result.iteration_time * 1e3:,.1f} ms/step, {result.throughput:,.0f} samples/s, "
            f"peak {peak} of {capacity} on {worst}: {fit}")


EXIT_STATUS = {0: "success",
               2: "bad input: an unknown model or preset, a missing or malformed file, a bad "
                  "argument (one line 'memflow: error: ...', never a traceback)",
               3: "the search found no strategy that fits: the plan folder is written, and "
                  "one line says by how much the best strategy misses",
               130: "interrupted (Ctrl-C)"}
"""The exit statuses of ``memflow``, shown in ``--help`` and the README."""
INFEASIBLE = 3


def shortfall(result) -> str:
    """By how much ``result`` misses: the device or host furthest over its memory."""
    peak = pd.concat([result.peak_memory, result.host_peak])
    capacity = pd.concat([result.capacity, result.host_capacity])
    over = (peak - capacity) / capacity
    worst = over.idxmax()
    return (f"{worst} needs {format_bytes(peak[worst])} of its {format_bytes(capacity[worst])}"
            f", {format_bytes(peak[worst] - capacity[worst])} ({over[worst]:.1%}) too much")


def _verdict(found, plan) -> int:
    """0 if the best strategy fits; else one line on stderr and :data:`INFEASIBLE`."""
    result = found.best_result
    if result.feasible:
        return 0
    print(f"memflow: no strategy found fits: the best one's {shortfall(result)}; the plan in "
          f"{plan}/ is that best. Search longer, use more GPUs or a larger --memory-limit "
          f"(exit status {INFEASIBLE})", file=sys.stderr)
    return INFEASIBLE


MOVES = {"all": None, "memory": {"policy": 0.6, "segment": 0.4}}
"""``--moves``: the search's move weights (None: its defaults)."""


def _search(inputs: dict[str, Any], folder: PlanFolder, *, iterations=None, seconds=None,
            seed=0, optimizer="sgd", moves="all", quiet=False, graph=None, cluster=None):
    # the cluster first: a wrong preset is reported before a capture that may take a while
    cluster = cluster if cluster is not None else load_cluster(inputs["cluster"],
                                                               inputs["memory_limit"])
    graph = graph if graph is not None else _graph(inputs)
    search = run_search(graph, cluster, iterations=iterations, seconds=seconds, seed=seed,
                        optimizer=optimizer, moves=MOVES[moves], progress=not quiet)
    plan = folder.write(search, {**inputs, "optimizer": optimizer, "seed": seed,
                                 "moves": moves})
    return search, plan


def _check_budget(iterations: int | None, seconds: float | None) -> None:
    if iterations is not None and iterations < 1:
        raise MemflowError(f"--iterations {iterations} must be at least 1")
    if seconds is not None and not seconds > 0:
        raise MemflowError(f"--seconds {seconds} must be positive")


def search(args: argparse.Namespace) -> int:
    """``memflow search``: run the search, write the plan folder, print the best; the exit
    status (:data:`INFEASIBLE` when the best does not fit)."""
    _check_budget(args.iterations, args.seconds)
    inputs = _inputs(args)
    with PlanFolder(args.out) as folder:    # a bad --out is reported before the search
        found, plan = _search(inputs, folder, iterations=args.iterations,
                              seconds=args.seconds, seed=args.seed, optimizer=args.optimizer,
                              moves=args.moves, quiet=args.quiet)
    print(f"best after {found.iteration} proposals: {_describe(found.best_result)}")
    print(f"plan written to {plan}/ ({', '.join(FILES.values())})")
    return _verdict(found, plan)


def simulate(args: argparse.Namespace) -> None:
    """``memflow simulate``: one step of the strategy; the per-device summary."""
    from ..sim import simulate as run

    inputs = _inputs(args)
    cluster = load_cluster(args.cluster, args.memory_limit)
    graph = _graph(inputs)
    strategy = load_strategy(args.strategy, graph, cluster)
    result = run(graph, strategy, cluster, optimizer=args.optimizer)
    print(f"{strategy.name!r} on {cluster.name}: {_describe(result)}")
    table = result.summary()
    with pd.option_context("display.width", 120, "display.max_rows", 64):
        print(table.to_string(formatters={
            **dict.fromkeys(("peak", "capacity", "headroom"), format_bytes),
            "compute_busy": lambda t: f"{t * 1e3:,.3f} ms", "utilization": "{:.0%}".format}))


def export(args: argparse.Namespace) -> None:
    """``memflow export``: the torchrun training script of a strategy, checked against the
    model before anything is written; prints the command that runs it."""
    from ..export import replicas, script
    from ..export.scripts import run_line

    inputs = _inputs(args)
    if inputs["input_shape"] is not None:
        raise MemflowError(f"export: the training script calls {args.model} for the model "
                           "and its example inputs; a factory returning a bare model "
                           "(--input-shape) cannot be exported; return (model, inputs)")
    strategy = load_strategy(args.strategy)
    path = script(strategy, args.out, model=args.model, model_options=inputs["options"],
                  batch_size=args.batch, optimizer=args.optimizer)
    small = _try_out_batch(strategy)
    print(f"wrote {path} and {path.with_suffix('.json').name} beside it; to try it on this "
          f"machine's CPU at a small batch:\n  {run_line(strategy, path, batch_size=small)}\n"
          f"to train as planned, on {replicas(strategy)} process(es):\n"
          f"  {run_line(strategy, path)}")


def report(args: argparse.Namespace) -> None:
    """``memflow report``: the plan folder's self-contained HTML report."""
    from ..report import write_plan_report

    path = write_plan_report(args.plan, args.out)
    print(f"wrote {path}")


def zoo(args: argparse.Namespace) -> None:
    """``memflow zoo``: the built-in models."""
    from .. import zoo as models

    table = models.info()[["family", "params", "batch_size", "inputs"]]
    with pd.option_context("display.width", 160, "display.max_rows", 200,
                           "display.max_colwidth", 70):
        print(table.to_string())


def presets(args: argparse.Namespace) -> None:
    """``memflow presets``: the named clusters (any NxGPU or NODESxNxGPU works too)."""
    from ..hardware import Cluster

    table = Cluster.presets()
    table["memory"] = table["memory"].map(format_bytes)
    with pd.option_context("display.width", 200, "display.max_colwidth", 60):
        print(table.to_string(index=False))


def demo(args: argparse.Namespace) -> int:
    """``memflow demo``: capture, show that data parallel does not fit, search, report,
    export — on resnet50 at a batch of 1024 over 4xV100-16GB unless told otherwise."""
    from .. import zoo as models
    from ..export import replicas, script
    from ..export.scripts import run_line
    from ..report import write_plan_report
    from ..sim import simulate as run
    from ..strategy import Strategy

    seconds = None if args.iterations is not None else args.seconds
    _check_budget(args.iterations, seconds)
    batch = args.batch or (DEMO["batch"] if args.model == DEMO["model"]
                           else models.spec_of(args.model).batch_size)
    inputs = {"model": args.model, "batch": batch, "options": parse_options(args.option),
              "input_shape": None, "units": "blocks", "cluster": args.cluster,
              "memory_limit": args.memory_limit}
    cluster = load_cluster(args.cluster, args.memory_limit)
    with PlanFolder(args.out) as folder:    # a bad --out is reported before the capture
        print(f"memflow demo: {args.model} at batch {batch} on {cluster.name}")
        print(f"1. capturing {args.model} (blocks as units) on meta tensors ...", flush=True)
        graph = _graph(inputs)
        dp = run(graph, Strategy.data_parallel(graph, cluster), cluster)
        print(f"   {len(graph)} units; data parallel: {_describe(dp)}")
        budget = f"{seconds:g} s" if seconds is not None else f"{args.iterations} proposals"
        print(f"2. searching memory policies for {budget} ...", flush=True)
        # Memory policies over data parallelism: the demo's point is that they make it fit.
        found, plan = _search(inputs, folder, iterations=args.iterations, seconds=seconds,
                              moves="memory", quiet=args.quiet, graph=graph, cluster=cluster)
    print(f"   best: {_describe(found.best_result)}")
    print("3. writing the report and the training script ...", flush=True)
    html = write_plan_report(plan, plan / DERIVED["report"], search=found)
    train = script(found.best, plan / DERIVED["train"], model=args.model,
                   model_options=inputs["options"], batch_size=batch, graph=graph)
    n = replicas(found.best)
    print(f"done:\n  strategy  {plan / FILES['strategy']}\n  report    {html}\n"
          f"  training  {train}, on this machine's CPU at a small batch:\n"
          f"    {run_line(found.best, train, batch_size=_try_out_batch(found.best))}\n"
          f"  (on {n} GPUs, leave out --batch-size to train at the planned {batch})")
    return _verdict(found, plan)
