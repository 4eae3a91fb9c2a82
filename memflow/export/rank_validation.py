"""Per-rank validation: run the exported script's ranks and compare each rank's memory with the
simulator's prediction for the devices it stands for (issue 14 item 4).

:func:`validate_ranks` writes the training script (:func:`memflow.export.script`), runs it under
``torchrun`` (gloo on CPU) for two steps with ``--measure FOLDER``, and reads back what every
rank wrote there (``rank<r>.json``, :func:`measure_rank`). The measured side comes from the
ranks alone: each rank, after its last training step, counts

* ``held`` — bytes its autograd graph holds for backward at the end of a forward
  (:func:`memflow.export.measure.held_bytes` inside the rank: every storage an op allocates,
  alive once outputs and inputs are dropped; parameters, buffers and FSDP2's gathered weights
  excluded). A pipeline stage holds the graphs of the micro-batches in flight at once: all
  ``m`` under GPipe, ``min(m, stages - s)`` on stage ``s`` under 1F1B (torch's
  ``Schedule1F1B`` runs ``stages - s`` forwards before its first backward, as memflow's
  :func:`~memflow.sim.pipeline.stage_sequence`);
* ``weights``, ``gradients``, ``optimizer`` — the bytes of the rank's local parameters and
  buffers, gradients, and optimizer states (a DTensor or FSDP2 shard counts its local tensor).

The predicted side, per rank, sums over the strategy's devices that rank runs: held bytes from
the memory model the simulator charges (:func:`~memflow.export.validation.predicted_held`,
scaled to the micro-batches in flight under 1F1B), model states from
``SimResult.model_states``. Columns are in ``docs/data-model.md`` ("Per-rank validation").
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
import torch
from torch import nn
from torch.utils import _pytree as pytree

from .._jsonio import read_json, write_json
from ..errors import ExportError
from .measure import HOST, held_bytes
from .segment import storage_key

__all__ = ["validate_ranks", "measure_rank", "state_bytes", "rank_devices", "METRICS",
           "in_flight"]

METRICS = ("held", "weights", "gradients", "optimizer")
"""What is compared per rank (``<metric>_predicted``, ``_measured``, ``_error`` columns)."""


# ---------------------------------------------------------------- inside a rank
def _local(t: torch.Tensor) -> torch.Tensor:
    return getattr(t, "_local_tensor", t)


def state_bytes(module: nn.Module, optimizer) -> dict[str, int]:
    """Local bytes of ``module``'s parameters and buffers, gradients, and ``optimizer``'s
    states (``step`` counters excluded); a DTensor counts its local shard.

    >>> m = nn.Linear(4, 2)
    >>> opt = torch.optim.Adam(m.parameters())
    >>> m(torch.ones(1, 4)).sum().backward(); opt.step()
    >>> state_bytes(m, opt)
    {'weights': 40, 'gradients': 40, 'optimizer': 80}
    """
    params = list(module.parameters())
    parts = getattr(optimizer, "parts", [optimizer])      # export.fsdp's ZeRO-1 beside others
    states = [getattr(o, "optim", o).state for o in parts]
    return {"weights": sum(_local(t).nbytes for t in [*params, *module.buffers()]),
            "gradients": sum(_local(p.grad).nbytes for p in params if p.grad is not None),
            "optimizer": sum(_local(t).nbytes for st in states for v in st.values()
                             for k, t in v.items() if k != "step" and torch.is_tensor(t))}


def _gathered(module: nn.Module) -> set[int]:
    """Storage keys of FSDP2's gathered (unsharded) parameters in ``module`` and of its flat
    all-gather buffers: communication buffers of the model states, not activations, though a
    forward leaves them alive (``reshard_after_forward=False``, or the last group's buffer
    until the next all-gather) and a matmul saves them. Read from FSDP2's private state."""
    keys = set()
    for m in module.modules():
        state = getattr(m, "_get_fsdp_state", None)
        group = getattr(state(), "_fsdp_param_group", None) if state else None
        if group is None:
            continue
        gathered = [t for p in group.fsdp_params for t in
                    (getattr(p, "_unsharded_param", None), *getattr(p, "all_gather_outputs", ()))]
        # the last group's flat all-gather output, kept until the next all-gather's copy-out
        kept = getattr(getattr(group, "comm_ctx", None), "all_gather_state", None)
        for result in (getattr(kept, "all_gather_result", None), group._all_gather_result):
            gathered.append(getattr(result, "all_gather_output", None))
        keys.update(storage_key(t) for t in gathered if t is not None)
    return keys


def measure_rank(folder: str | Path, rank: int, path: str | None, module: nn.Module,
                 optimizer, call: tuple[tuple, dict], *, stage=None,
                 microbatches: int = 1, schedule: str = "gpipe") -> dict[str, Any]:
    """What rank ``rank`` writes to ``folder/rank<r>.json`` after its last training step
    (module doc): ``module`` is what it trains (DistributedDataParallel, FSDP2 or DTensor
    wrapped, or its pipeline ``stage``'s module), ``call`` one step's ``(args, kwargs)`` of the
    rank's batch. Every rank of the group calls it (a forward runs its collectives).
    """
    record: dict[str, Any] = {"rank": rank, "path": path or "replicas", **state_bytes(
        getattr(module, "module", module) if stage is None else module, optimizer)}
    if stage is None:
        def finish(probes):     # a backward, so that DDP or FSDP2 close their step
            sum(probes).backward()
            optimizer.zero_grad(set_to_none=True)
        held = held_bytes(module, _inputs(*call), skip=lambda: _gathered(module), then=finish)
    else:
        index, n = stage.stage_index, stage.num_stages
        if stage.is_first:
            args, kwargs = pytree.tree_map_only(
                torch.Tensor, lambda t: t[:t.shape[0] // microbatches], call)
            inputs = _inputs(args, kwargs)
        else:   # what the stage receives: the activations of the metadata its trace gave
            metas = stage._stage_meta.inputs
            args = tuple(torch.zeros_like(m.to_tensor("cpu").detach()).requires_grad_(
                m.dtype.is_floating_point) for m in metas)
            inputs = args
        held = held_bytes(module, inputs, forwards=in_flight(index, n, microbatches, schedule))
    record["held"] = sum(v for k, v in held.items() if k != HOST)
    record["offloaded"] = held.get(HOST, 0)
    write_json(Path(folder) / f"rank{rank}.json", record)
    return record


def _inputs(args: tuple, kwargs: dict):
    """``(args, kwargs)`` as :func:`~memflow.export.measure.held_bytes` takes inputs."""
    if args and kwargs:
        raise ExportError("the model takes positional and keyword inputs at once; per-rank "
                          "validation measures models called with one kind")
    return args if args or not kwargs else kwargs


STEPS = 2
"""Training steps of a validation run: DistributedDataParallel rebuilds its gradient buckets
in the second step's forward (a one-off allocation the size of the gradients), so the
measuring forward comes after it."""


def in_flight(stage: int, stages: int, microbatches: int, schedule: str) -> int:
    """Micro-batches whose graphs stage ``stage`` holds at once: all under GPipe,
    ``min(m, stages - stage)`` under 1F1B.

    >>> [in_flight(s, 3, 4, "1f1b") for s in range(3)], in_flight(0, 3, 4, "gpipe")
    ([3, 2, 1], 4)
    """
    return microbatches if schedule == "gpipe" else min(microbatches, stages - stage)


# ---------------------------------------------------------------- the parent
def rank_devices(strategy, path: str | None) -> list[tuple[str, ...]]:
    """The strategy's devices each rank runs, by rank, on the script's ``path``.

    >>> from memflow.strategy import Strategy
    >>> s = Strategy(["a", "b"], devices=[("gpu0", "gpu2"), ("gpu1", "gpu3")], sample=[2, 2],
    ...              stage=[0, 1], microbatches=2)
    >>> rank_devices(s, "pipeline")
    [('gpu0',), ('gpu1',), ('gpu2',), ('gpu3',)]
    """
    from .pipelining import stage_ranks
    from .tensor_parallel import tensor_ranks

    if path in ("pipeline", "tensor"):
        ranks = stage_ranks(strategy) if path == "pipeline" else tensor_ranks(strategy)
        out: list[list[str]] = [[] for _ in range(max(ranks.values()) + 1)]
        for d, r in ranks.items():
            out[r].append(d)
        return [tuple(d) for d in out]
    replicas = int(strategy.sample[0])
    return [tuple(dict.fromkeys(strategy.devices[i][r] for i in range(len(strategy))))
            for r in range(replicas)]


def _predicted(graph, strategy, cluster, optimizer: str, path, devices) -> list[dict]:
    from .. import simulate
    from .pipelining import stages as count_stages
    from .validation import predicted_held

    held = predicted_held(graph, strategy)
    states = simulate(graph, strategy, cluster, optimizer=optimizer).model_states
    n, m = count_stages(strategy), strategy.microbatches
    rows = []
    for rank, names in enumerate(devices):
        row = {"held": sum(held.get(d, 0.0) for d in names)}
        if path == "pipeline":      # the memory model holds every micro-batch (GPipe)
            row["held"] *= in_flight(rank % n, n, m, strategy.schedule) / m
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
    from .scripts import _model_graph, script, written_path

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
