"""Hybrid data × model parallelism projected end to end (Pal et al., IEEE Micro 2019).

Data parallelism over ``N`` devices multiplies the global batch by ``N``; beyond the batch the
problem's statistics can use, every step still costs a step but the epochs to the target grow.
Splitting each data-parallel worker over ``m`` devices by model parallelism keeps the global
batch ``m`` times smaller. ``hybrid_projection`` compares, for each number of devices:

* the best pure data parallelism: ``N`` workers, global batch ``N · b``;
* the best hybrid: ``N / m`` workers for ``m`` in 2, 4, 8, each worker's units split over its
  ``m`` devices as contiguous runs (plain model parallelism) or as a pipeline of ``m`` stages
  (GPipe-style micro-batches) — whichever the simulator finds fastest (Megatron-style tensor
  parallelism on request, see :data:`SPLITS`);

with the per-worker batch ``b`` fixed (the graph's). Each step time is simulated on a cluster of
``N`` GPUs; the epochs to the target come from a statistical-efficiency model
(:mod:`memflow.planners.convergence`); the projected training time is
``epochs(B) · samples_per_epoch / B · step_time``.

The graph at each global batch comes from :func:`memflow.planners.batch.at_batch` (linear scaling)
unless ``graph`` is a function ``batch -> OpGraph``.

>>> from memflow.search.synthetic import chain_graph
>>> g = chain_graph(4, width=8192, batch=64, seed=None)      # per-worker batch 64
>>> t = hybrid_projection(g, [8, 64], convergence=CriticalBatch(b_noise=512, epochs_min=10),
...                       samples_per_epoch=1_000_000)
>>> t[["dp_batch", "hybrid_batch", "hybrid_split", "best"]]
         dp_batch  hybrid_batch hybrid_split    best
devices
8             512           128     pipeline  hybrid
64           4096          1024     pipeline  hybrid
"""
from __future__ import annotations

import math
from typing import Any, Callable, Iterable

import numpy as np
import pandas as pd

from ..errors import PlanError
from ..hardware import Cluster
from ..hardware.presets import build
from ..sim import Evaluator
from ..strategy import Strategy
from .batch import graph_source
from .convergence import DATASETS, CriticalBatch, convergence_model

__all__ = ["hybrid_projection", "hybrid_strategies", "CriticalBatch", "MP_DEGREES", "SPLITS"]

MP_DEGREES = (2, 4, 8)
SPLITS = ("model parallel", "pipeline", "tensor parallel")
"""How a worker may be split: contiguous runs of units, a GPipe pipeline of them, or
Megatron-style tensor parallelism. Pal et al. split layers across devices (the first two);
tensor parallelism is charged one all-reduce per unit, which flatters recurrent layers (their
real split communicates at every time step), so it is not tried by default."""
_GPUS_PER_NODE = 8


def hybrid_strategies(graph, devices: list[str], mp: int, per_worker_batch: int,
                      splits: Iterable[str] = SPLITS) -> dict[str, Strategy]:
    """The splits (of :data:`SPLITS`) of ``len(devices) / mp`` workers of ``mp`` devices each;
    the pipeline runs ``2·mp`` micro-batches (``mp`` when the batch does not divide)."""
    dp = len(devices) // mp
    out = {}
    if "model parallel" in splits:
        out["model parallel"] = Strategy.hybrid(graph, devices, dp=dp, mp=mp)
    for M in (2 * mp, mp) if "pipeline" in splits else ():
        if per_worker_batch % M == 0:
            out["pipeline"] = Strategy.pipeline(graph, devices, stages=mp, microbatches=M,
                                                dp=dp, schedule="gpipe")
            break
    if "tensor parallel" in splits:
        out["tensor parallel"] = Strategy.tensor_parallel(graph, devices, tp=mp, dp=dp)
    return out


def _cluster_for(gpu: str) -> Callable[[int], Cluster]:
    def make(n: int) -> Cluster:
        per = min(n, _GPUS_PER_NODE)
        if n % per:
            raise PlanError(f"hybrid_projection: {n} devices is not a whole number of "
                            f"{_GPUS_PER_NODE}-GPU nodes; use 1-8 or a multiple of 8")
        return build(gpu, gpus_per_node=per, nodes=n // per)
    return make


def hybrid_projection(graph, cluster_sizes: Iterable[int], *, convergence: Any = None,
                      samples_per_epoch: int | None = None, per_worker_batch: int | None = None,
                      gpu: str = "V100-16GB", cluster: Callable[[int], Cluster] | None = None,
                      mp_degrees: Iterable[int] = MP_DEGREES,
                      splits: Iterable[str] = SPLITS[:2], optimizer: str = "sgd"
                      ) -> pd.DataFrame:
    """Best pure data parallelism against the best hybrid, per number of devices, end to end.

    ``graph``: an OpGraph captured at the per-worker batch (or a function ``batch ->
    OpGraph``, then give ``per_worker_batch``). ``convergence``: None (the default curve of
    ``graph.meta["model"]``), a :class:`~memflow.planners.convergence.CriticalBatch`, a DataFrame of
    measurements (``global_batch``, ``epochs``) or a function ``global_batch -> epochs``.
    ``samples_per_epoch`` defaults to the model's dataset. Clusters are nodes of 8 ``gpu``
    (or ``cluster(n)``). ``splits``: how workers may be split (see :data:`SPLITS`; plain model
    parallelism and pipelines by default, as Pal et al.).

    One row per device count: for ``dp_*`` and ``hybrid_*``, ``step`` (s), ``batch`` (global),
    ``epochs``, ``hours`` (projected training time); ``hybrid_mp`` and ``hybrid_split``; ``gain``
    (data-parallel hours over hybrid hours, minus 1: > 0 when hybrid is faster) and ``best``.
    Configurations that do not fit in memory are left out (NaN when none fits); ``min_peak``
    is the smallest peak (bytes, worst device) of any configuration tried at that count, so a
    ``"none fits"`` row says how much memory per device it would take.
    ``df.attrs["candidates"]`` lists every configuration simulated.
    """
    source = graph_source(graph)
    if per_worker_batch is None:
        if callable(graph) and not hasattr(graph, "meta"):
            raise PlanError("hybrid_projection: give per_worker_batch when graph is a function")
        per_worker_batch = int(graph.meta["batch_size"])
    b = int(per_worker_batch)
    if b < 1:
        raise PlanError(f"hybrid_projection: per_worker_batch must be >= 1, got {b}")
    degrees = sorted({int(m) for m in mp_degrees})
    if not degrees or degrees[0] < 2:
        raise PlanError(f"hybrid_projection: mp_degrees must be device counts >= 2 per worker, "
                        f"got {list(mp_degrees)}")
    model = getattr(graph, "meta", {}).get("model") if hasattr(graph, "meta") else None
    epochs_of = convergence_model(convergence, model if convergence is None else None)
    if samples_per_epoch is None:
        if model not in DATASETS:
            raise PlanError(f"hybrid_projection: give samples_per_epoch (no dataset size known "
                            f"for model {model!r}; known: {', '.join(DATASETS)})")
        samples_per_epoch = DATASETS[model]
    if not (isinstance(samples_per_epoch, (int, np.integer)) and samples_per_epoch >= 1):
        raise PlanError(f"hybrid_projection: samples_per_epoch must be a positive whole number "
                        f"of training samples, got {samples_per_epoch!r}")
    splits = tuple(splits)
    bad = [x for x in splits if x not in SPLITS]
    if bad or not splits:
        raise PlanError(f"hybrid_projection: unknown split {bad[0] if bad else splits!r}; "
                        f"valid: {', '.join(SPLITS)}")
    make = cluster or _cluster_for(gpu)
    sizes = [int(n) for n in cluster_sizes]
    if not sizes or min(sizes) < 1:
        raise PlanError(f"hybrid_projection: cluster_sizes must be positive device counts, got "
                        f"{sizes}")
    rows = []
    for n in sizes:
        c = make(n)
        devices = [str(d) for d in c.devices.index[:n]]
        for mp in [1] + [m for m in degrees if n % m == 0]:
            batch = (n // mp) * b
            g = source(batch)
            if mp > len(g):   # fewer units than devices per worker: no split exists
                continue
            ev = Evaluator(g, c, optimizer=optimizer)
            tried = ({"data parallel": Strategy.data_parallel(g, devices)} if mp == 1
                     else hybrid_strategies(g, devices, mp, b, splits))
            for split, s in tried.items():
                out = ev(s)
                epochs = float(epochs_of(batch))
                rows.append({"devices": n, "mp": mp, "split": split, "batch": batch,
                             "step": out.time, "fits": out.fits, "peak": out.peak,
                             "epochs": epochs,
                             "hours": epochs * samples_per_epoch / batch * out.time / 3600})
    cand = pd.DataFrame(rows)
    summary = [_summarise(n, cand[cand["devices"] == n]) for n in sizes]
    df = pd.DataFrame(summary).set_index("devices")
    df.attrs["candidates"] = cand
    return df


def _summarise(n: int, cand: pd.DataFrame) -> dict[str, Any]:
    ok = cand[cand["fits"]]
    dp = ok[ok["mp"] == 1]
    hy = ok[ok["mp"] > 1]
    row: dict[str, Any] = {"devices": n}
    for tag, part in (("dp", dp), ("hybrid", hy)):
        best = part.loc[part["hours"].idxmin()] if len(part) else None
        for col in ("step", "batch", "epochs", "hours"):
            row[f"{tag}_{col}"] = best[col] if best is not None else math.nan
        if tag == "hybrid":
            row["hybrid_mp"] = int(best["mp"]) if best is not None else 0
            row["hybrid_split"] = best["split"] if best is not None else ""
    row["gain"] = row["dp_hours"] / row["hybrid_hours"] - 1.0
    row["min_peak"] = float(cand["peak"].min()) if len(cand) else math.nan
    if np.isnan(row["hybrid_hours"]) and np.isnan(row["dp_hours"]):
        row["best"] = "none fits"
    elif np.isnan(row["dp_hours"]) or row["hybrid_hours"] < row["dp_hours"]:
        row["best"] = "hybrid"
    else:
        row["best"] = "data parallel"
    for col in ("dp_batch", "hybrid_batch"):
        row[col] = int(row[col]) if not np.isnan(row[col]) else row[col]
    return row
