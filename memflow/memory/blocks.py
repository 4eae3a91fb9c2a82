"""The memory model in one place: which storages exist, on which placement, from when to when.

``step_blocks`` turns (graph, policies, placements) into *blocks*: a number of bytes per part of
a placement (a *layout*: degrees + devices), a category, and the task boundaries ("anchors")
at which the block is allocated and freed. ``memflow.estimate`` runs the blocks against the
single-device program order; the simulator runs the same blocks against its schedule. The rules
are those of ``docs/data-model.md`` ("Memory model"), which follow PyTorch:

* weights, buffers, optimizer state and DDP gradient buckets are persistent;
* a parameter gradient lives from the end of the backward of its last reader (the first to
  run) to the end of the optimizer step;
* an activation storage lives from its producer's forward to the later of its last forward
  read (a model output's is the loss: the step drops the output once the loss is computed),
  the end of backward (model outputs, only if the graph's ``keep_output``) and, when held
  for backward, the start of the backward of its first saver. Policies decide what *holds* it (keep > segment input >
  compress > offload > selective > recompute); a selective unit holds what its expensive ops
  make until its backward (their outputs used only inside it until its recomputation, as
  ``create_selective_checkpoint_contexts`` caches them); a recompute segment holds its inputs only if one of its
  units saves something (else it is no segment: :func:`holding_segments`);
* a storage read by a unit on another placement is copied there by a transfer, and that copy
  follows the same rules among the readers on that placement;
* activation gradients live from the end of the last reader's backward to the start of the
  producer's backward; forward and backward temporaries during their task. A backward lets
  go of what it consumes at its start and shows what it makes at its end: its temporaries
  (``bwd_tmp_bytes``) are the peak above both, as PyTorch frees node by node (capture).

What the placements decide (records, copies, gradients: :mod:`memflow.memory.records`) is
computed once per placement; what the policies decide is computed for all records at once
(:mod:`memflow.memory.replan`), into four block *slots* per record
(:mod:`memflow.memory.slots`). :class:`~memflow.memory.table.BlockTable` keeps every block
of the last policies it planned, so that a change of a few units' policies re-derives only
the records those units touch (delta re-planning).

Anchors are ``(kind, key, edge)``: ``kind`` one of the ``A_*`` codes, ``key`` a unit position
(or a copy number for transfers, a layout for the optimizer), ``edge`` 0 for the task's start
and 1 for its end.
"""
from __future__ import annotations

import numpy as np

from .arrays import GraphArrays
from .plan import StepBlocks
from .records import (A_BWD, A_COMPRESS, A_DECOMP, A_FWD, A_GXFER, A_OFFLOAD, A_OPT,
                      A_PREFETCH, A_RECOMP, A_XFER, Copies, Copy, placements)
from .slots import (ACTIVATIONS, CATEGORIES, COMMUNICATION, EVERY_MB, FIRST_MB, GRADIENTS,
                    OPTIMIZER, OPTIMIZER_STATES, TRANSIENT, WEIGHTS)
from .table import BlockTable

__all__ = ["StepBlocks", "Copy", "Copies", "BlockTable", "step_blocks", "placement_key",
           "CATEGORIES", "OPTIMIZER_STATES", "WEIGHTS", "GRADIENTS", "OPTIMIZER", "ACTIVATIONS",
           "TRANSIENT", "COMMUNICATION", "FIRST_MB", "EVERY_MB", "A_FWD", "A_BWD", "A_RECOMP",
           "A_OFFLOAD", "A_PREFETCH", "A_COMPRESS", "A_DECOMP", "A_XFER", "A_GXFER", "A_OPT"]


def placement_key(layout: np.ndarray, degrees: np.ndarray, microbatches: int,
                  sequence: np.ndarray | None = None, stage: np.ndarray | None = None) -> tuple:
    """The key under which :func:`step_blocks` keeps a placement's records in its ``cache``:
    what :func:`~memflow.memory.records.placements` depends on besides the graph."""
    return (layout.tobytes(), degrees.tobytes(), int(microbatches),
            None if sequence is None else sequence.tobytes(),
            None if stage is None else stage.tobytes())


def step_blocks(ga: GraphArrays, policy: np.ndarray, segment: np.ndarray, layout: np.ndarray,
                degrees: np.ndarray, microbatches: int, ratio: np.ndarray, *,
                optimizer: str = "sgd", foreach: bool = True, cache: dict | None = None,
                precision: str | None = None, shard: np.ndarray | None = None,
                offload: np.ndarray | None = None,
                sequence: np.ndarray | None = None, stage: np.ndarray | None = None,
                host_is_device: bool = False) -> StepBlocks:
    """The blocks of one training step.

    ``degrees`` is ``(layouts, 3)``: sample, parameter, attribute of each layout; ``layout``,
    ``policy``, ``segment`` and ``ratio`` (compression ratio, used where ``policy`` is
    compress) are per unit. ``foreach`` selects PyTorch's multi-tensor optimizer kernels (the
    CUDA default: one optimizer-sized temporary for Adam) over the per-parameter loop (CPU).
    ``cache`` (a dict the caller keeps) holds what the placements alone decide, so strategies
    that differ in memory policies only share it. ``precision``, ``shard`` and ``offload``
    (per unit: shard level code, optimizer on the host) decide the model states
    (:func:`memflow.memory.states.unit_states`). ``sequence`` (per unit) is the strategy's
    sequence parallelism and ``stage`` its pipeline stages
    (:func:`memflow.memory.records.placements`). ``host_is_device``: the step runs on a CPU,
    whose host memory is its own (:func:`memflow.memory.table.host_on_device`).
    """
    key = placement_key(layout, degrees, microbatches, sequence, stage)
    placed = cache.get(key) if cache is not None else None
    if placed is None:
        placed = placements(ga, layout, (degrees[layout, 0] * degrees[layout, 2]).astype(np.float64),
                            degrees[layout, 1], microbatches, sequence=sequence, stage=stage)
        if cache is not None:
            cache[key] = placed
    table = BlockTable(ga, placed, layout, degrees, microbatches, optimizer=optimizer,
                       foreach=foreach, precision=precision, shard=shard, offload=offload,
                       host_is_device=host_is_device)
    return table.derive(policy, segment, ratio)
