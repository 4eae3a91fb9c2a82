"""``memflow.export.validate``: run a strategy for real and compare memory with the prediction.

Rows (``metric``), each with ``predicted``, ``measured`` and ``error`` (measured / predicted
- 1):

* ``saved_bytes`` — bytes held for backward on the compute device at the end of the forward,
  each storage once, parameters and buffers excluded; compressed storages at their packed size.
  Predicted from the memory model's blocks (:func:`predicted_held`), measured by
  :func:`~memflow.export.measure.held_bytes` on the exported model;
* ``offloaded_bytes`` — the same for storages waiting in host memory;
* ``peak_bytes`` (only with a CUDA GPU) — the peak of one training step (forward, backward,
  optimizer step; the second step, so that optimizer state exists), predicted by
  :func:`memflow.estimate` and measured with ``torch.cuda.max_memory_allocated`` less the
  weights of the caller's model (validate runs a copy beside it).

Both sides describe one replica on the batch given: a data-parallel strategy is measured as
one replica processing ``example_inputs``, so the prediction is for the same strategy with
its sample degree folded to 1, and device names are replaced by the torch devices they run on
here (units that share a device share a placement, with no transfer between them).
"""
from __future__ import annotations

import gc
import itertools
from typing import Any, Mapping

import numpy as np
import pandas as pd
import torch
from torch import nn
from torch.utils import _pytree as pytree

from ..errors import ExportError
from ..graph.capture import split_inputs
from ..memory.blocks import step_blocks
from ..strategy.strategy import Strategy
from .accumulation import accumulate, accumulates, micro_batches
from .exported import apply
from .measure import HOST, held_bytes
from .placement import replica_devices, torch_devices
from .spans import unit_spans

__all__ = ["validate", "predicted_held", "local_strategy", "capture_units"]


def local_strategy(strategy: Strategy, replica: int = 0,
                   devices: Mapping[str, str | torch.device] | None = None) -> Strategy:
    """``strategy`` as one process runs it: replica ``replica``, on named torch devices.

    >>> s = Strategy(["a"], devices=[("gpu0", "gpu1")], sample=[2])
    >>> local_strategy(s, 1, {"gpu1": "cpu"}).devices
    (('cpu',),)
    """
    parts = replica_devices(strategy, replica, torch_devices(strategy.device_names, devices))
    named = []
    for u, devs in zip(strategy.units, parts):
        names = tuple(str(d) for d in devs)
        if len(set(names)) != len(names):
            raise ExportError(f"unit {u!r}: its {len(names)} parameter shards all run on "
                              f"{names[0]} here, so their memory cannot be told apart; "
                              "validate a parameter split on distinct devices")
        named.append(names)
    return Strategy(strategy.units, devices=named, policy=strategy.policy,
                    error_bound=strategy.error_bound, segment_break=strategy.segment_break,
                    parameter=strategy.parameter,
                    attribute=strategy.attribute, stage=strategy.stage,
                    microbatches=strategy.microbatches, schedule=strategy.schedule,
                    name=strategy.name)


def predicted_held(graph, strategy: Strategy, *, by_layout: bool = False,
                   processes: bool = False):
    """Bytes the memory model holds for backward at the end of the forward, by device name,
    offloaded bytes under ``"host"`` (summed over the parts of each placement); with
    ``by_layout``, on the device per part of each of ``strategy.layouts`` (an array). With
    ``processes``, the strategy as a process per device runs it, each unsplit unit of a
    tensor-parallel group on every device of the group (:func:`memflow.sim.replication.as_run`; its
    layouts then).

    What :meth:`~memflow.memory.blocks.StepBlocks.held_for_backward` counts, per part of each
    placement. Micro-batches add up (GPipe holds them all; gradient accumulation — 1F1B with
    one stage — one at a time, :mod:`~memflow.export.accumulation`); activations at the
    strategy's precision (:func:`~memflow.sim.precision.activation_arrays`: under bf16, the
    program capture's bf16 pass recorded).
    """
    from ..sim.cpu_time import compression_ratios, step_ratio
    from ..sim.precision import activation_arrays
    from ..memory.blocks import placement_key
    from ..memory.records import placements
    from ..sim.replication import as_run, replicated_arrays, split_degrees

    strategy.validate(graph)
    scale = whole = rowwise = None
    if processes:
        strategy, scale, whole, rowwise = as_run(strategy, graph)
    degrees = np.array([k[:3] for k in strategy.layouts], np.int64)
    ga = replicated_arrays(activation_arrays(graph, strategy.precision), scale, whole, rowwise)
    layout, M, seq = strategy.layout_ids, strategy.microbatches, strategy.sequence_parallel
    stage = strategy.stage
    placed = placements(ga, layout, (degrees[layout, 0] * degrees[layout, 2]).astype(float),
                        split_degrees(strategy, degrees), M, sequence=seq, stage=stage)
    plan = step_blocks(ga, strategy.policy, strategy.segment, layout, degrees, M,
                       # the exported step runs here, on the CPU: its compressor's ratios
                       compression_ratios(strategy, ga.half,
                                          step_ratio(True, graph.meta.get("map_bits"))),
                       sequence=seq, stage=stage,
                       cache={placement_key(layout, degrees, M, seq, stage): placed})
    device, host = plan.held_for_backward()
    if accumulates(strategy):      # activations are per micro-batch; one is held at a time
        device, host = device / strategy.microbatches, host / strategy.microbatches
    if by_layout:
        return device
    out: dict[str, float] = {}
    for layout, on_device, on_host in zip(strategy.layouts, device, host):
        for name in layout[3]:
            out[name] = out.get(name, 0.0) + float(on_device)
            if on_host:
                out[HOST] = out.get(HOST, 0.0) + float(on_host)
    return out


def _peak_row(model: nn.Module, original: nn.Module, graph, local: Strategy,
              example_inputs: Any, optimizer: str) -> tuple[float, float]:
    """(predicted, measured) peak bytes of one training step of ``model`` on the GPU; the
    weights of ``original`` (the model ``model`` was copied from) are not counted."""
    from ..sim import estimate

    predicted = float(estimate(graph, "cuda", optimizer=optimizer, strategy=local).attrs["peak"])
    opt_cls = {"sgd": torch.optim.SGD, "momentum": torch.optim.SGD, "adam": torch.optim.Adam}
    kw = {"momentum": 0.9} if optimizer == "momentum" else {}
    opt = opt_cls[optimizer](model.parameters(), lr=1e-6, **kw)
    args, kwargs = split_inputs(example_inputs)
    for step in range(2):       # the second step runs with optimizer state allocated
        opt.zero_grad(set_to_none=True)
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        m = local.microbatches if accumulates(local) else 1
        accumulate(model, (args, kwargs), m, lambda out, _: sum(
            t.float().sum() for t in pytree.tree_leaves(out)
            if isinstance(t, torch.Tensor) and t.requires_grad))
        opt.step()
        torch.cuda.synchronize()
    copy_of = {t.untyped_storage()._cdata: t.untyped_storage().nbytes()
               for t in [*original.parameters(), *original.buffers()] if t.is_cuda}
    return predicted, float(torch.cuda.max_memory_allocated() - sum(copy_of.values()))


def validate(model: nn.Module, example_inputs: Any, strategy: Strategy, graph=None, *,
             replica: int = 0, devices: Mapping[str, str | torch.device] | None = None,
             optimizer: str = "sgd") -> pd.DataFrame:
    """Predicted against measured memory of ``strategy`` on ``model`` (see the module doc).

    ``model`` and ``example_inputs`` are real tensors (on CPU, or on the GPU for
    ``peak_bytes``); the model is copied, not changed. ``graph`` is the graph the strategy
    was made for; without one it is captured from the model with the strategy's units.

    >>> import torch
    >>> from torch import nn
    >>> from memflow.strategy import Strategy
    >>> model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    >>> s = Strategy(["0", "1", "2"], devices=[("gpu0",)] * 3).with_policy(
    ...     {"0": "offload", "1": "recompute"})
    >>> validate(model, torch.randn(8, 16), s, devices={"gpu0": "cpu"})[["predicted", "measured"]]
                     predicted  measured
    metric
    saved_bytes         2048.0    2048.0
    offloaded_bytes      512.0     512.0
    """
    local = local_strategy(strategy, replica, devices)
    if graph is None:
        graph = capture_units(model, example_inputs, strategy)
    exported = apply(model, local, graph, devices={d: d for d in local.device_names})
    predicted = predicted_held(graph, local)
    if accumulates(local):      # each call runs one micro-batch: measure the first
        args, kwargs = micro_batches(*split_inputs(example_inputs), local.microbatches)[0]
        example_inputs = args if args or not kwargs else kwargs
    measured = held_bytes(exported, example_inputs)
    rows = {"saved_bytes": (sum(v for k, v in predicted.items() if k != HOST),
                            sum(v for k, v in measured.items() if k != HOST)),
            "offloaded_bytes": (predicted.get(HOST, 0.0), measured.get(HOST, 0))}
    if torch.cuda.is_available() and any(d.startswith("cuda") for d in local.device_names):
        rows["peak_bytes"] = _peak_row(exported, model, graph, local, example_inputs, optimizer)
    df = pd.DataFrame([(m, float(p), float(x)) for m, (p, x) in rows.items()],
                      columns=["metric", "predicted", "measured"]).set_index("metric")
    df["error"] = np.where(df["predicted"] > 0, df["measured"] / df["predicted"].where(
        df["predicted"] > 0, 1.0) - 1.0, np.where(df["measured"] > 0, np.inf, 0.0))
    df.attrs.update(strategy=strategy.name, model=graph.meta.get("model"),
                    predicted_by_device=predicted, measured_by_device=measured)
    return df


def capture_units(model: nn.Module, example_inputs: Any, strategy: Strategy):
    """The graph of ``strategy``'s units: capture with its module units selected."""
    from ..graph.capture import from_torch

    spans = unit_spans(strategy.units)
    selected = [s.module for s in spans if s.role == "module"] or "leaves"
    device = next((t.device.type for t in [*model.parameters(), *model.buffers()]), "cpu")
    graph = from_torch(model, example_inputs, units=selected,
                       backend="cuda" if device == "cuda" else "cpu")
    if graph.names != list(strategy.units):
        missing = object()
        pairs = list(itertools.zip_longest(strategy.units, graph.names, fillvalue=missing))
        i, (ours, theirs) = next((i, p) for i, p in enumerate(pairs) if p[0] != p[1])
        where = (f"the strategy has {len(strategy)} units, the model more from {theirs!r} on"
                 if ours is missing else
                 f"the model has {len(graph)} units, the strategy more from {ours!r} on"
                 if theirs is missing else
                 f"the strategy's unit {i} is {ours!r} but the model's is {theirs!r}")
        raise ExportError(f"{where} (the model captured with the strategy's units): the "
                          "strategy was made for another model or granularity")
    return graph
