"""Model states per unit: weights, gradients and optimizer states, by precision, optimizer,
shard level and optimizer placement (``docs/data-model.md``, "Model states").

Per trainable parameter (Ψ elements), with ``w`` the graph's parameter width (4 bytes, or 2 for
a unit captured in half precision):

============  =======  =========  ==============  ============================
precision     weights  gradients  master weights  optimizer state (per tensor)
============  =======  =========  ==============  ============================
fp32, amp     w        w          —               w
bf16          2        2          4               4
pure-bf16     2        2          —               2
============  =======  =========  ==============  ============================

The optimizer keeps :data:`~memflow.strategy.OPTIMIZERS` state tensors (Adam: 2), of 1 byte
for ``adam8bit``. With ``bf16`` and Adam that is ZeRO's 2 + 2 + 12 = 16 bytes per parameter;
the master weights count as optimizer state, as ZeRO counts them.

Sharding over a unit's ``N`` sample replicas divides, level by level (ZeRO-1/2/3, the
ZeRO paper's Figure 1: ``(2 + 2 + K)Ψ``, ``2Ψ + 2Ψ + KΨ/N``, ``2Ψ + (2 + K)Ψ/N``,
``(2 + 2 + K)Ψ/N``): the optimizer state (and master weights), then the gradients, then the
parameters (buffers stay replicated, as FSDP leaves them). What sharding adds back for a while
is counted as *communication* buffers: a parameter-sharded unit's gathered parameters, held
during its forward, backward and recomputation — the whole unit's, beside its shard, since
FSDP2 all-gathers into separate unsharded tensors and frees only those
(``torch/distributed/fsdp/_fully_shard/_fsdp_param.py``: ``free_storage`` of
``all_gather_outputs``; the sharded parameter stays); a gradient-sharded unit's full gradient
beyond its shard, held during its backward until the reduce-scatter.

A gradient-sharded unit (ZeRO-2) is charged its whole parameters for the step, as the ZeRO
paper and DeepSpeed's stage 2 keep them. FSDP2's ``reshard_after_forward=False`` (what
``memflow export`` writes for this level) keeps a 1/N shard between steps but all-gathers
before forward and keeps the whole parameters until the unit's backward ends: at the
forward-to-backward turn, the step's peak, it holds them all too, so the peak and the
``weights`` column agree; the one all-gather per step is charged after the optimizer step
(DeepSpeed's) rather than before forward (FSDP2's), the same bytes on the same ring. An unsharded (or only
optimizer-sharded) replicated unit keeps DDP's persistent gradient bucket. A unit whose
optimizer is offloaded keeps its optimizer state (and a gradient copy, for the host step) in
host memory instead.

A pipeline stage holds every weight and buffer its units read (:func:`stage_copies`):
``torch.distributed.pipelining`` gives a weight read in two stages (GPT-2's tied embedding and
head) to both, each with its gradient and optimizer state, and sums the gradients over them;
a buffer read in two stages (a causal mask the blocks share) is copied to both as well.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..strategy.shard_levels import (OPTIMIZERS, S_GRADIENTS, S_OPTIMIZER, S_PARAMETERS)
from .arrays import csr
from .jit import njit

__all__ = ["UnitStates", "unit_states", "stage_copies", "stage_arrays", "WIDTHS"]

WIDTHS = {"fp32": (None, 0, None), "amp": (None, 0, None), "bf16": (2, 4, 4),
          "pure-bf16": (2, 0, 2)}
"""precision -> (weight and gradient width, master-weight width, optimizer-state width) in
bytes per element; None: the graph's own width."""


@dataclass(frozen=True)
class UnitStates:
    """Per unit, bytes per part of its placement (read-only arrays)."""

    weights: np.ndarray          # parameters (the shard) and buffers, on the device
    gradients: np.ndarray        # the gradient block (the shard), backward to optimizer step
    optimizer: np.ndarray        # optimizer state and master weights on the device
    host: np.ndarray             # ... on the host (offloaded), with a gradient copy
    bucket: np.ndarray           # DDP's persistent gradient bucket (communication)
    gathered: np.ndarray         # the unit's all-gathered parameters (communication)
    unsharded: np.ndarray        # full gradient beyond the shard until reduce-scatter
    gather: np.ndarray           # full parameter bytes each all-gather assembles (0: none)
    scatter: np.ndarray          # full gradient bytes each reduce-scatter reduces (0: none)
    state_factor: np.ndarray     # one state tensor's bytes on the device per trainable byte
    update: np.ndarray           # bytes the optimizer step moves on the device
    regather: np.ndarray         # parameter bytes all-gathered after the step (ZeRO-1/2)
    host_elements: np.ndarray    # parameters the host's optimizer step updates


def unit_states(ga, s: np.ndarray, p: np.ndarray, a: np.ndarray, shard: np.ndarray | None,
                offload: np.ndarray | None, precision: str | None,
                optimizer: str) -> UnitStates:
    """The model states of every unit, given per unit its sample, parameter and attribute
    degrees ``s``, ``p``, ``a``, shard level code, optimizer offload flag; ``precision`` (None:
    as ``fp32``) and ``optimizer`` are global.

    Factors that are exactly 1 for an unsharded ``fp32``/``amp`` strategy keep its numbers
    those of the model before shard levels existed.

    >>> import pandas as pd
    >>> from memflow.graph import OpGraph
    >>> from memflow.memory.arrays import graph_arrays
    >>> g = OpGraph(pd.DataFrame({"fwd_flops": [1.0], "bwd_flops": [2.0], "param_bytes": [400.0],
    ...                           "trainable_bytes": [400.0]}, index=["fc"]),
    ...             pd.DataFrame({"bytes": [8], "producer": ["<input>"], "consumers": [["fc"]]}))
    >>> one = np.ones(1, np.int64)
    >>> st = unit_states(graph_arrays(g), 4 * one, one, one, np.array([1]), None, "bf16", "adam")
    >>> st.weights + st.gradients + st.optimizer      # 100 parameters: 2 + 2 + 12/4 bytes each
    array([700.])
    """
    n = ga.n
    shard = np.zeros(n, np.int8) if shard is None else np.asarray(shard)   # a Strategy's: int8
    offload = np.zeros(n, bool) if offload is None else np.asarray(offload, bool)
    width, master, state = WIDTHS[precision or "fp32"]
    k, state_width = OPTIMIZERS[optimizer]
    rows = _state_arrays(
        ga.half, ga.param_bytes, ga.trainable_bytes, ga.buffer_bytes, s, p, a, shard, offload,
        _NONE if width is None else width, master, _NONE if state is None else state, k,
        _NONE if state_width is None else state_width)
    rows.flags.writeable = False        # its rows, the fields: shared by the tables caching them
    return UnitStates(*rows)


_NONE = -1      # a width :data:`WIDTHS` or :data:`OPTIMIZERS` leaves to the graph (None)


@njit
def _state_arrays(half, param_bytes, trainable_bytes, buffer_bytes, s, p, a, shard, offload,
                  width, master, state, k, state_width):
    """The fields of :class:`UnitStates` in order, rows of one array, as one compiled pass
    (as numpy expressions they were ~45 calls per new placement of a search); each value is
    made by the operations those expressions made, in their order (so the same bits). The
    widths are :data:`WIDTHS`' and :data:`OPTIMIZERS`', ``_NONE`` for None."""
    n = len(half)
    out = np.zeros((13, n))
    for i in range(n):
        w0 = 2.0 if half[i] else 4.0
        wf = 1.0 if width == _NONE else width / w0              # weights and gradients
        if state_width == _NONE:
            sf = (w0 if state == _NONE else state) / w0
        else:
            sf = state_width / w0
        mf = master / w0
        train = trainable_bytes[i] / p[i]
        N = float(s[i])
        opt_n = N if shard[i] >= S_OPTIMIZER else 1.0
        grad_n = N if shard[i] >= S_GRADIENTS else 1.0
        par_n = N if shard[i] >= S_PARAMETERS else 1.0
        full_w = (param_bytes[i] * wf) / p[i]
        full_g = train * wf
        gradients = full_g / grad_n
        opt = (k * sf + mf) * train / opt_n
        gathers = shard[i] >= S_PARAMETERS and N > 1
        off = offload[i]
        out[0, i] = (param_bytes[i] * wf / par_n + buffer_bytes[i]) / p[i]      # weights
        out[1, i] = gradients
        out[2, i] = 0.0 if off else opt                                        # optimizer
        out[3, i] = opt + gradients if off else 0.0                            # host
        out[4, i] = full_g if s[i] * a[i] > 1 and shard[i] < S_GRADIENTS else 0.0  # bucket
        out[5, i] = full_w if gathers else 0.0                                 # gathered
        out[6, i] = full_g - gradients if shard[i] >= S_GRADIENTS else 0.0     # unsharded
        out[7, i] = full_w if gathers else 0.0                                 # gather
        out[8, i] = full_g if shard[i] >= S_GRADIENTS and N > 1 else 0.0       # scatter
        out[9, i] = 0.0 if off else sf / opt_n                                 # state_factor
        # update: reads and writes of the parameters and states, reads of the gradients
        out[10, i] = 0.0 if off else (3 * wf + 2 * (k * sf + mf)) * train / opt_n
        out[11, i] = (full_w if S_OPTIMIZER <= shard[i] < S_PARAMETERS and N > 1
                      else 0.0)                                                # regather
        out[12, i] = train / w0 / opt_n if off else 0.0                        # host_elements
    return out


def stage_copies(ga, stage: np.ndarray) -> list[tuple[int, int, int]]:
    """``(owner, holder, k)`` for each weight (or buffer) ``k`` of ``ga``'s parameter arrays
    that a stage reads but a unit of another stage owns: ``holder`` is the stage's first unit
    that reads it; ``stage`` is per unit (one stage: no copies).

    >>> import pandas as pd
    >>> from memflow.graph import OpGraph
    >>> from memflow.memory.arrays import graph_arrays
    >>> g = OpGraph(pd.DataFrame({"fwd_flops": [1.0] * 3, "bwd_flops": [2.0] * 3},
    ...                          index=["embed", "block", "head"]),
    ...             pd.DataFrame({"bytes": [8], "producer": ["<input>"], "consumers": [["embed"]]}),
    ...             parameters=pd.DataFrame({"name": ["embed.weight"], "bytes": [400],
    ...                                      "numel": [100], "trainable": [True],
    ...                                      "owner": ["embed"], "readers": [["embed", "head"]]}))
    >>> stage_copies(graph_arrays(g), np.array([0, 0, 1]))
    [(0, 2, 0)]
    """
    out = []
    if np.max(stage, initial=0) < 1:
        return out
    ptr, idx = ga.param_readers_ptr, ga.param_readers_idx
    for k in np.flatnonzero(np.diff(ptr) > 1).tolist():
        owner = int(ga.param_owner[k])
        held = {int(stage[owner])}
        for r in idx[ptr[k]:ptr[k + 1]].tolist():
            if int(stage[r]) not in held:
                held.add(int(stage[r]))
                out.append((owner, r, k))
    return out


def stage_arrays(ga, stage: np.ndarray):
    """``ga`` as the stages hold it (``ga`` itself where no weight is copied): each copy of
    :func:`stage_copies` added to its holder's parameters or buffers and made a parameter row
    of its own, read by its stage's units, its gradient made by the last of them; the original
    keeps the readers of its owner's stage."""
    copies = stage_copies(ga, stage)
    if not copies:
        return ga
    ptr, idx = ga.param_readers_ptr, ga.param_readers_idx
    readers = [idx[ptr[k]:ptr[k + 1]].tolist() for k in range(len(ptr) - 1)]
    rows = [ga.param_owner, ga.param_grad_bytes, ga.param_grad_unit, ga.param_storage_bytes,
            ga.param_is_buffer, ga.param_tensor_split, ga.param_row_split]
    owner, grad, grad_unit, storage, buffer, split, rowwise = (r.tolist() for r in rows)
    added = {"param_bytes": np.zeros(ga.n), "trainable_bytes": np.zeros(ga.n),
             "buffer_bytes": np.zeros(ga.n)}
    for _, holder, k in copies:
        mine = [r for r in readers[k] if stage[r] == stage[holder]]
        for column, row in ((owner, holder), (grad, grad[k]), (grad_unit, mine[-1]),
                            (storage, storage[k]), (buffer, buffer[k]), (split, split[k]),
                            (rowwise, rowwise[k]), (readers, mine)):
            column.append(row)
        added["buffer_bytes" if buffer[k] else "param_bytes"][holder] += storage[k]
        added["trainable_bytes"][holder] += grad[k]
    for k in {k for _, _, k in copies}:
        readers[k] = [r for r in readers[k] if stage[r] == stage[owner[k]]]
        grad_unit[k] = readers[k][-1]
    r_ptr, r_idx = csr(readers)
    return replace(ga, **{c: getattr(ga, c) + b for c, b in added.items()},
                   param_owner=np.array(owner, np.int64), param_grad_bytes=np.array(grad),
                   param_grad_unit=np.array(grad_unit, np.int64),
                   param_storage_bytes=np.array(storage), param_is_buffer=np.array(buffer, bool),
                   param_tensor_split=np.array(split, bool),
                   param_row_split=np.array(rowwise, bool),
                   param_readers_ptr=r_ptr, param_readers_idx=r_idx)
