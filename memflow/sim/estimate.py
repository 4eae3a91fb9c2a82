"""``memflow.estimate``: training-step memory of one device, by category, and its peak.

The step is replayed in program order (forward, backward with its recomputations, offloads,
prefetches, optimizer step) against the blocks of :func:`memflow.memory.blocks.step_blocks` —
the same blocks, tasks and ledger the simulator uses, without timing.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from .._tables import ReadableFrame
from .._units import format_bytes
from ..errors import MemflowError
from ..hardware import Cluster
from ..memory.allocator import ALLOCATORS, CUBLAS_WORKSPACE, STEP_WORKSPACES, replay
from ..memory.blocks import CATEGORIES, OPTIMIZER_STATES, TRANSIENT, placement_key, step_blocks
from ..strategy.shard_levels import PRECISIONS
from ..memory.records import placements
from ..strategy import Strategy
from .cpu_time import compression_ratios, cpu_figures, step_ratio
from .expand import Timing, expand
from .kinds import TASK_KINDS
from .ledger import ledger_plan, ledgers
from .precision import ACTIVATION_WIDTH, activation_arrays
from .structure import structure

__all__ = ["estimate"]

def _capacity_and_foreach(graph, device: Any) -> tuple[float, bool, str]:
    """(capacity bytes or NaN, whether the optimizer runs foreach kernels, device label)."""
    if device is None:
        device = graph.meta.get("backend", "cuda")
    if isinstance(device, str) and device in ("cpu", "cuda"):
        return float("nan"), device == "cuda", device
    if isinstance(device, str):
        device = Cluster.preset(device)
    if hasattr(device, "devices"):
        first = device.devices.iloc[0]
        return float(first["memory_bytes"]), True, str(device.devices.index[0])
    raise MemflowError(f"device must be 'cpu', 'cuda', a cluster preset name or a Cluster, "
                       f"got {device!r}")

def _on_cpu(device: Any, label: str) -> bool:
    """The step runs on a CPU: ``"cpu"``, or a cluster of CPUs measured here (what decides
    the compressor its compress units run, :func:`~memflow.sim.cpu_time.step_compressor`)."""
    return label == "cpu" or (hasattr(device, "devices") and cpu_figures(device) is not None)


def estimate(graph, device: Any = None, *, optimizer: str = "sgd", precision: str | None = None,
             strategy=None, allocator: str | None = None) -> pd.DataFrame:
    """Memory of one training step on one device, by category, and the peak.

    ``device``: ``"cpu"`` (PyTorch's per-parameter optimizer loops), ``"cuda"`` (foreach
    optimizer kernels), a cluster preset name or a :class:`memflow.Cluster` (its first device:
    the capacity is reported too); default: the graph's capture backend. ``strategy``: memory
    policies to apply (a single-device strategy of this graph); default keep everything.
    ``optimizer`` and ``precision`` (the strategy's own precision first) decide the model
    states (``docs/data-model.md``, "Model states"); an offloaded optimizer is not counted,
    except on a CPU, whose host memory is the device's own: there offloaded storages and
    optimizer states are counted where they live, the CPU's memory, and backward reads an
    offloaded storage's host image in place (:func:`memflow.memory.table.host_on_device`).
    ``allocator="cuda"``: each tensor is charged the CUDA caching allocator's block (512-B
    rounding, :mod:`memflow.memory.allocator`) and ``df.attrs["reserved"]`` estimates the peak
    of ``torch.cuda.memory_reserved`` by replaying the step's allocations and frees through
    the allocator's segments (model states as one allocation per category, first), and
    ``transient`` and the peak include cuBLAS's workspaces (two threads of the step:
    :data:`~memflow.memory.allocator.CUBLAS_WORKSPACE` each).

    Rows: the categories (``weights``, ``gradients``, ``optimizer``, ``activations``,
    ``transient``, ``communication``) and ``total``; columns ``at_peak`` (bytes when the
    device peaks) and ``max`` (the category's own maximum over the step), in bytes; printed,
    they read in KiB/MiB/GiB under a line naming the peak (a
    :class:`~memflow._tables.ReadableFrame`). ``df.attrs`` holds ``peak``, ``peak_task``
    (e.g. ``"backward fc"``), ``phase``, ``capacity``, ``fits``.

    >>> import pandas as pd
    >>> from memflow.graph import OpGraph
    >>> g = OpGraph(pd.DataFrame({"fwd_flops": [1.0, 1.0], "bwd_flops": [2.0, 2.0],
    ...                           "param_bytes": [400, 400], "trainable_bytes": [400, 400]},
    ...                          index=["a", "b"]),
    ...             pd.DataFrame({"bytes": [100, 200, 300], "producer": ["<input>", "a", "b"],
    ...                           "consumers": [["a"], ["b"], []], "savers": [["a"], ["b"], []],
    ...                           "is_output": [False, False, True], "requires_grad": False}))
    >>> df = estimate(g, "cpu", optimizer="adam")
    >>> df["at_peak"].astype(int).to_dict()
    {'weights': 800, 'gradients': 800, 'optimizer': 1600, 'activations': 0, 'transient': 1200, 'communication': 0, 'total': 4400}
    >>> df.attrs["peak_task"]
    'optimizer'
    >>> print(df)
    peak 4.30 KiB during optimizer on cpu
                    at_peak       max
    category
    weights           800 B     800 B
    gradients         800 B     800 B
    optimizer      1.56 KiB  1.56 KiB
    activations         0 B     600 B
    transient      1.17 KiB  1.17 KiB
    communication       0 B       0 B
    total          4.30 KiB  4.30 KiB
    """
    if optimizer not in OPTIMIZER_STATES:
        raise MemflowError(f"unknown optimizer {optimizer!r}; valid: {', '.join(OPTIMIZER_STATES)}")
    if precision not in (None, *PRECISIONS):
        raise MemflowError(f"unknown precision {precision!r}; valid: {', '.join(PRECISIONS)}")
    if allocator not in ALLOCATORS:
        raise MemflowError(f"unknown allocator {allocator!r}; valid: None (tensor bytes) or "
                           "'cuda' (the CUDA caching allocator's blocks)")
    capacity, foreach, label = _capacity_and_foreach(graph, device)
    on_cpu = _on_cpu(device, label)
    if strategy is None:
        strategy = Strategy.single_device(graph)
    strategy.validate(graph)
    precision = strategy.precision or precision
    ga = activation_arrays(graph, precision)
    if len(strategy.device_names) != 1:
        raise MemflowError("estimate is for one device; use memflow.simulate for strategies "
                           f"over several devices (this one uses {strategy.device_names})")
    degrees = np.array([k[:3] for k in strategy.layouts], np.int64)
    layout, M = strategy.layout_ids, strategy.microbatches
    placed = placements(ga, layout, (degrees[layout, 0] * degrees[layout, 2]).astype(np.float64),
                        degrees[layout, 1], M, allocator)
    plan = step_blocks(ga, strategy.policy, strategy.segment, layout, degrees, M,
                       compression_ratios(strategy, ga.half | (precision in ACTIVATION_WIDTH),
                                          step_ratio(on_cpu, graph.meta.get("map_bits"))),
                       optimizer=optimizer,
                       foreach=foreach, cache={placement_key(layout, degrees, M): placed},
                       precision=precision, shard=strategy.shard,
                       offload=strategy.offload_optimizer, host_is_device=on_cpu)
    S = structure(ga, placed, layout, degrees, strategy.stage, M, strategy.schedule)
    T = expand(S, Timing.untimed(S, ga.n), plan)
    step = np.arange(len(T.kind), dtype=np.float64)      # program order, one task at a time
    one = [np.zeros(1, np.int64) for _ in strategy.layouts]
    L, _ = ledgers(ledger_plan(plan, one, 1, one, 1), T, step, step + 1)
    at_peak = L.persistent[0].copy()
    cat_max = L.persistent[0].copy()
    ev = int(L.peak_event[0])
    if len(L.delta):
        cat = np.zeros((len(L.delta), len(CATEGORIES)))
        cat[np.arange(len(L.delta)), L.category] = L.delta
        running = np.cumsum(cat, 0) + L.persistent[0]
        cat_max = np.maximum(cat_max, running.max(0))
        if ev >= 0:
            at_peak = running[ev]
    peak = float(L.peak[0])
    # cuBLAS's workspaces, held from the first matrix product of each thread on
    libraries = ([(("workspace", k), CUBLAS_WORKSPACE) for k in range(STEP_WORKSPACES)]
                 if allocator == "cuda" else [])
    workspace = float(sum(nbytes for _, nbytes in libraries))
    at_peak[TRANSIENT] += workspace
    cat_max[TRANSIENT] += workspace
    peak += workspace
    if ev >= 0:
        task = int(L.task[ev])
        unit = T.unit[task]
        peak_task = TASK_KINDS[T.kind[task]] + (f" {ga.names[unit]}" if unit >= 0 else "")
        phase = TASK_KINDS[T.kind[task]]
    else:
        peak_task = phase = "start"
    fits = bool(peak <= capacity) if capacity == capacity else None
    caption = f"peak {format_bytes(peak)} during {peak_task} on {label}" + (
        "" if fits is None else
        f" of {format_bytes(capacity)}: {'fits' if fits else 'OUT OF MEMORY'}")
    df = ReadableFrame({"at_peak": at_peak, "max": cat_max}, index=list(CATEGORIES),
                       units={"at_peak": "bytes", "max": "bytes"}, caption=caption)
    df.loc["total"] = [peak, peak]
    df.index.name = "category"
    if allocator is not None:
        states = [(("state", c), b) for c, b in enumerate(L.persistent[0]) if b > 0]
        df.attrs["reserved"] = float(replay(
            states + libraries + list(zip(L.instance.tolist(), L.delta.tolist()))).peak_reserved)
    df.attrs.update(peak=peak, peak_task=peak_task, phase=phase, capacity=capacity,
                    fits=fits,
                    device=label, optimizer=optimizer)
    return df

