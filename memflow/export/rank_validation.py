"""Per-rank validation: run the exported script's ranks and compare each rank's memory with the
simulator's prediction for the devices it stands for (issue 14 item 4).

:func:`validate_ranks` writes the training script (:func:`memflow.export.script`), runs it under
``torchrun`` (gloo on CPU) for :data:`~memflow.export.rank_measure.STEPS` steps with
``--measure FOLDER``, and reads back what every rank wrote there: the measured side comes from
the ranks alone (:mod:`memflow.export.rank_measure`: held-for-backward bytes, and local bytes of
weights, gradients and optimizer states).

The predicted side, per rank, sums over the strategy's devices that rank runs
(:func:`rank_devices`; the simulator places a tensor-parallel group's unsplit units on every
device of the group, as its ranks run them: :func:`memflow.sim.replication.as_run`):
held bytes from the memory model the simulator charges
(:func:`~memflow.export.validation.predicted_held`, scaled to the micro-batches a 1F1B stage
holds at once), model states from ``SimResult.model_states``. Columns are in
``docs/data-model.md`` ("Per-rank validation").
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd

from .._jsonio import read_json
from ..errors import ExportError
from .pipelining import stage_ranks, stages
from .rank_measure import STEPS, in_flight
from .sample_groups import group_ranks
from .stage_tensor import stage_tensor_degree
from .scripts import _model_graph, script, written_path
from .tensor_parallel import tensor_ranks
from .validation import predicted_held

__all__ = ["validate_ranks", "rank_devices", "METRICS"]

METRICS = ("held", "weights", "gradients", "optimizer")
"""What is compared per rank (``<metric>_predicted``, ``_measured``, ``_error`` columns)."""


def rank_devices(strategy, path: str | None) -> list[tuple[str, ...]]:
    """The strategy's devices each rank runs, by rank, on the script's ``path``.

    >>> from memflow.strategy import Strategy
    >>> s = Strategy(["a", "b"], devices=[("gpu0", "gpu2"), ("gpu1", "gpu3")], sample=[2, 2],
    ...              stage=[0, 1], microbatches=2)
    >>> rank_devices(s, "pipeline")
    [('gpu0',), ('gpu1',), ('gpu2',), ('gpu3',)]
    >>> rank_devices(Strategy(["a", "b"], devices=[("gpu0", "gpu1"), ("gpu1",)], sample=[2, 1]),
    ...              "sample")        # a process per device, in whichever groups it runs
    [('gpu0',), ('gpu1',)]
    """
    if path in ("pipeline", "tensor", "sample"):
        ranks = {"pipeline": stage_ranks, "tensor": tensor_ranks,
                 "sample": group_ranks}[path](strategy)
        out: list[list[str]] = [[] for _ in range(max(ranks.values()) + 1)]
        for d, r in ranks.items():
            out[r].append(d)
        return [tuple(d) for d in out]
    replicas = int(strategy.sample[0])
    return [tuple(dict.fromkeys(strategy.devices[i][r] for i in range(len(strategy))))
            for r in range(replicas)]


def _predicted(graph, strategy, cluster, optimizer: str, path, devices) -> list[dict]:
    from .. import simulate

    held = predicted_held(graph, strategy, processes=True)
    states = simulate(graph, strategy, cluster, optimizer=optimizer).model_states
    n, m = stages(strategy), strategy.microbatches
    t = stage_tensor_degree(strategy) if path == "pipeline" else 1     # rank (r·n + s)·t + k
    rows = []
    for rank, names in enumerate(devices):
        row = {"held": sum(held.get(d, 0.0) for d in names)}
        if path == "pipeline":      # the memory model holds every micro-batch (GPipe)
            row["held"] *= in_flight(rank // t % n, n, m, strategy.schedule) / m
        for k in METRICS[1:]:
            row[k] = float(sum(states.at[d, k] for d in names if d in states.index))
        rows.append(row)
    return rows


def validate_ranks(strategy, model: str, *, model_options: Mapping[str, Any] | None = None,
                   batch_size: int | None = None, graph=None, cluster=None,
                   optimizer: str = "adam", folder: str | Path | None = None,
                   timeout: float = 300) -> pd.DataFrame:
    """Run ``strategy``'s exported script on its ranks (``torchrun``, gloo, one step) and
    compare each rank's measured memory with the prediction; one row per rank.

    ``model`` is a zoo name or ``file.py:factory`` as for :func:`memflow.export.script`;
    ``graph`` the graph the strategy was made for (else captured at ``batch_size``);
    ``cluster`` the cluster the prediction simulates (default: a V100 preset with the
    strategy's device count; memory sizes do not change the bytes compared).
    """
    from .. import Cluster

    options = dict(model_options or {})
    if graph is None:
        graph = _model_graph(strategy, model, options, batch_size)
    if cluster is None:
        cluster = Cluster.preset(f"{len(strategy.device_names)}xV100-16GB")
    work = Path(folder) if folder is not None else Path(tempfile.mkdtemp(prefix="memflow-ranks-"))
    path = script(strategy, work / "train.py", model=model, model_options=options,
                  batch_size=batch_size, optimizer=optimizer, graph=graph)
    kind = written_path(path)
    devices = rank_devices(strategy, kind)
    out = work / "measured"
    out.mkdir(exist_ok=True)
    for old in out.glob("rank*.json"):
        old.unlink()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc_per_node", str(len(devices)), str(path), "--steps", str(STEPS),
           "--measure", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if done.returncode:
        lines = (done.stderr + done.stdout).splitlines()
        why = [ln for ln in lines if "Error" in ln or "error:" in ln][:2] or lines[-4:]
        raise ExportError(f"the script of strategy {strategy.name!r} failed on its "
                          f"{len(devices)} ranks (exit {done.returncode}; {path} runs it again "
                          "with --measure): " + " | ".join(ln.strip() for ln in why))
    measured = [read_json(out / f"rank{r}.json") for r in range(len(devices))]
    predicted = _predicted(graph, strategy, cluster, optimizer, kind, devices)
    rows = []
    for rank, (names, pred, meas) in enumerate(zip(devices, predicted, measured)):
        row = {"rank": rank, "devices": ",".join(names), "path": meas["path"]}
        for k in METRICS:
            p, x = float(pred[k]), float(meas[k])
            row.update({f"{k}_predicted": p, f"{k}_measured": x,
                        f"{k}_error": x / p - 1.0 if p else (0.0 if not x else np.inf)})
        rows.append(row)
    df = pd.DataFrame(rows).set_index("rank")
    df.attrs.update(strategy=strategy.name, model=model, script=str(path))
    return df
