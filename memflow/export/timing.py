"""Predicted against measured step time: the exported script, run for real.

:func:`step_time` writes the training script of a strategy (:func:`memflow.export.script`),
runs it (``torchrun`` with one process per data-parallel replica; plain ``python`` for one),
and takes the steady-state step time after a warm-up (:func:`step_seconds`: the mean by the
wall clock, the median by CPU time). The prediction is
:func:`memflow.simulate`'s ``iteration_time`` for the same graph, strategy and cluster — on a
CPU, a cluster measured here (:meth:`memflow.Cluster.local`); on a GPU, the GPU's cluster.

:func:`validate` is :func:`memflow.export.validate`: the memory rows of
:mod:`memflow.export.validation`, and with ``time=True`` this row. The GPU path runs only
where CUDA is: :func:`gpu_problem` says why not otherwise, and :func:`validate` prints that
reason instead of a row. The script waits for
every step's loss (a CUDA synchronisation), so a CUDA step time is the GPU's, not the launch
queue's.

>>> from memflow.strategy import Strategy
>>> s = Strategy(["a"], devices=[("gpu0",)])
>>> gpu_problem(s) if not __import__("torch").cuda.is_available() else None
'no CUDA device here: torch.cuda.is_available() is False (torch ... built without CUDA)'
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Mapping

import pandas as pd
import torch
from torch.utils import _pytree as pytree

from ..errors import ExportError
from .multiprocess import processes
from .scripts import script, written_path

__all__ = ["validate", "step_time", "measured_step_times", "step_seconds", "gpu_problem",
           "cpu_devices", "WARMUP", "STEPS"]

WARMUP = 3
"""Steps run before timing: allocator warm-up, optimizer state, the first DDP bucket rebuild."""
STEPS = 5
"""Steps timed after the warm-up; they give the measured step time (:func:`step_seconds`)."""


def gpu_problem(strategy, devices: Mapping[str, str] | None = None) -> str | None:
    """Why ``strategy``'s GPU devices cannot be timed here (one line), or None when they can
    (or when ``devices`` maps every one of them to the CPU)."""
    import torch

    wanted = [d for d in strategy.device_names if not str((devices or {}).get(d, "cuda"))
              .startswith("cpu")]
    if not wanted:
        return None
    if not torch.cuda.is_available():
        built = f"built with CUDA {torch.version.cuda}" if torch.version.cuda else \
            "built without CUDA"
        return (f"no CUDA device here: torch.cuda.is_available() is False "
                f"(torch {torch.__version__} {built})")
    if torch.cuda.device_count() < len(wanted):
        return (f"the strategy uses {len(wanted)} GPUs but {torch.cuda.device_count()} are "
                "visible here")
    return None


def cpu_devices(cluster) -> dict[str, str] | None:
    """``{device: "cpu"}`` for a cluster measured on this machine's CPU (``Cluster.local``),
    else None (the script's default: ``gpuK`` on ``cuda:K``)."""
    local = cluster.devices["model"] == "local-cpu"
    return {d: "cpu" for d in cluster.devices.index} if local.all() else None


def step_seconds(times: list[float], clock: str) -> float:
    """The measured step time of the timed steps' ``times`` by ``clock``: by the wall clock
    their mean (the wall time of the whole run, per step), by CPU time their median.

    On a shared machine a step shorter than the scheduler's time slice often runs without
    waiting for a core, so a median of wall times measures a step that met no other job,
    while the wall figures it is predicted from (:func:`memflow.hardware.microbench.
    _seconds_per_call`) are means over a window that include the waits: a median would set
    one against the other (a 3.6 ms step predicted 24 ms under load 13). CPU time has no
    waits; its median drops a step that a page fault or a collection slowed.

    >>> step_seconds([1.0, 1.0, 4.0], "wall"), step_seconds([1.0, 1.0, 4.0], "cpu")
    (2.0, 1.0)
    """
    if not times:
        return float("nan")
    return statistics.fmean(times) if clock == "wall" else statistics.median(times)


def measured_step_times(strategy, model: str, *, model_options: Mapping[str, Any] | None = None,
                        batch_size: int | None = None, graph=None, optimizer: str = "sgd",
                        devices: Mapping[str, str] | None = None, warmup: int = WARMUP,
                        steps: int = STEPS, timeout: float = 600.0) -> dict[str, Any]:
    """Seconds of each timed step of the exported script of ``strategy`` on ``model`` (a zoo
    name or ``file.py:factory``), after ``warmup`` untimed steps, by two clocks: ``{"wall":
    [...], "cpu": [...]}`` (the CPU time of rank 0's process); on a GPU also
    ``peak_allocated`` and ``peak_reserved``, the run's ``torch.cuda.max_memory_allocated``
    and ``max_memory_reserved`` (bytes, rank 0's device)."""
    with tempfile.TemporaryDirectory(prefix="memflow-time-") as folder:
        path = script(strategy, Path(folder) / "train.py", model=model,
                      model_options=model_options, batch_size=batch_size, optimizer=optimizer,
                      devices=devices, graph=graph)
        out = Path(folder) / "step_times.json"
        n = processes(strategy, written_path(path))
        launcher = ([sys.executable] if n == 1 else
                    [sys.executable, "-m", "torch.distributed.run", "--standalone",
                     "--nproc_per_node", str(n)])
        env = dict(os.environ)
        # the script imports memflow: this copy of it, wherever the caller runs from
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        run = subprocess.run([*launcher, str(path), "--steps", str(warmup + steps),
                              "--step-times", str(out)], capture_output=True, text=True,
                             env=env, timeout=timeout, check=False)
        if run.returncode != 0 or not out.is_file():
            tail = (run.stderr or run.stdout).strip().splitlines()[-3:]
            raise ExportError(f"the exported script of strategy {strategy.name!r} on "
                              f"{model!r} failed (exit {run.returncode}): " + " | ".join(tail))
        return {key: value[warmup:] if isinstance(value, list) else value
                for key, value in json.loads(out.read_text()).items()}


def step_time(strategy, model: str, cluster, *, model_options: Mapping[str, Any] | None = None,
              batch_size: int | None = None, graph=None, optimizer: str = "sgd",
              devices: Mapping[str, str] | None = None, warmup: int = WARMUP,
              steps: int = STEPS) -> pd.DataFrame:
    """One row ``step_time``: ``predicted`` (simulated on ``cluster``), ``measured`` (the
    script's timed steps by the cluster's clock, :func:`step_seconds`), ``error`` (measured /
    predicted - 1). ``attrs`` keeps every
    timed step (``step_times``, by the cluster's clock; ``wall_times`` and ``cpu_times``, the
    CPU time of rank 0's process), the ``clock``, the GPU reason when the row could not be
    measured, and on a GPU the run's ``peak_allocated`` and ``peak_reserved`` bytes (None
    elsewhere).

    The clock is the cluster's (:func:`memflow.hardware.local.local_cluster`): a one-process
    CPU cluster measured by CPU time is compared with the step's CPU time, which another
    job's load on a shared machine barely moves; every other cluster with wall time.

    ``graph`` is the graph of ``strategy`` (captured from the model at ``batch_size`` when
    None). ``devices`` maps device names to torch devices; for a cluster measured here
    (:func:`cpu_devices`) every device is the CPU. A GPU strategy without a usable GPU gets
    a row with ``measured`` NaN and the reason (:func:`gpu_problem`) in ``attrs["skipped"]``.
    """
    from ..sim import simulate
    from .factory import build_model
    from .validation import capture_units

    devices = devices if devices is not None else cpu_devices(cluster)
    if graph is None:
        made, inputs = build_model(model, batch_size, model_options or {})
        graph = capture_units(made, inputs, strategy)
    predicted = float(simulate(graph, strategy, cluster, optimizer=optimizer).iteration_time)
    problem = gpu_problem(strategy, devices)
    clock = str(cluster.devices["clock"].iloc[0]) if "clock" in cluster.devices else "wall"
    times = {"wall": [], "cpu": []} if problem else measured_step_times(
        strategy, model, model_options=model_options, batch_size=batch_size, graph=graph,
        optimizer=optimizer, devices=devices, warmup=warmup, steps=steps)
    measured = step_seconds(times[clock], clock)
    df = pd.DataFrame({"predicted": [predicted], "measured": [measured],
                       "error": [measured / predicted - 1.0]},
                      index=pd.Index(["step_time"], name="metric"))
    df.attrs.update(step_times=times[clock], wall_times=times["wall"], cpu_times=times["cpu"],
                    clock=clock, skipped=problem, cluster=cluster.name,
                    peak_allocated=times.get("peak_allocated"),
                    peak_reserved=times.get("peak_reserved"))
    return df


def validate(model, example_inputs, strategy, graph=None, *, time: bool = False, cluster=None,
             factory: str | None = None, model_options: Mapping[str, Any] | None = None,
             optimizer: str = "sgd", **options: Any) -> pd.DataFrame:
    """:func:`memflow.export.validation.validate` (the memory rows; ``options`` are its own),
    and with ``time=True`` a ``step_time`` row (:func:`step_time`): the exported training
    script of the whole strategy, run for real, against the simulated step.

    The script rebuilds the model in each process, so ``factory`` names it (a zoo name or
    ``file.py:factory``, with ``model_options``; default: the graph's ``meta["model"]``, a
    zoo name). ``graph`` is the strategy's graph (every replica's batch); without one the
    script trains ``example_inputs``' batch per replica. The prediction is simulated on
    ``cluster`` (default: :meth:`Cluster.local <memflow.hardware.local.local>` with the
    strategy's device names, one process each). Where the strategy's GPUs are not here the
    reason is printed and the row left out (for ``peak_bytes`` as for ``step_time``).

    >>> import memflow
    >>> model, x = memflow.zoo.get("chain", 8, device="cpu", n=2, width=16)
    >>> g = memflow.zoo.graph("chain", batch_size=8, n=2, width=16, units="blocks")
    >>> s = memflow.Strategy.data_parallel(g, ["gpu0"]).with_policy(recompute=["layers.0"])
    >>> validate(model, x, s, g, devices={"gpu0": "cpu"}).index.tolist()  # time=False
    ['saved_bytes', 'offloaded_bytes']
    """
    from .. import zoo
    from ..hardware.local import local
    from .factory import is_file_model
    from .placement import replicas
    from .validation import validate as memory_rows

    df = memory_rows(model, example_inputs, strategy, graph, optimizer=optimizer, **options)
    if not time:
        return df
    problem = gpu_problem(strategy, options.get("devices"))
    if problem:         # validation's peak_bytes row needs the strategy's GPUs too
        print(f"peak_bytes: skipped, {problem}")
    factory = factory or str((graph.meta if graph is not None else df.attrs).get("model"))
    if factory not in zoo.names() and not is_file_model(factory):
        raise ExportError(f"time=True runs the exported script, which rebuilds the model in "
                          f"each process: name it with factory= (a zoo name, one of "
                          f"{zoo.names()[:4]}..., or 'file.py:factory'); {factory!r} is "
                          "neither")
    if graph is not None:
        batch = int(graph.meta.get("batch_size") or 0) or None
    else:
        first = next(t for t in pytree.tree_leaves(example_inputs) if isinstance(t, torch.Tensor))
        batch = int(first.shape[0]) * replicas(strategy)
    if cluster is None:
        cluster = local(len(strategy.device_names), names=strategy.device_names)
    row = step_time(strategy, factory, cluster, model_options=model_options, batch_size=batch,
                    graph=graph, optimizer=optimizer)
    if row.attrs["skipped"]:
        print(f"step_time: skipped, {row.attrs['skipped']}")
        return df
    out = pd.concat([df, row[["predicted", "measured", "error"]]])
    out.attrs.update(df.attrs, step_times=row.attrs["step_times"], cluster=cluster.name)
    return out
