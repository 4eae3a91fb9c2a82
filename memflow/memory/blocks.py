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
computed once per placement; what the policies decide is computed here, for all records at
once, into four block *slots* per record. :class:`BlockTable` keeps every block of the last
policies it planned, so that a change of a few units' policies re-derives only the records
those units touch (delta re-planning).

Anchors are ``(kind, key, edge)``: ``kind`` one of the ``A_*`` codes, ``key`` a unit position
(or a copy number for transfers, a layout for the optimizer), ``edge`` 0 for the task's start
and 1 for its end.
"""
from __future__ import annotations

from functools import cached_property

import numpy as np

from ..strategy.policies import (MECHANISMS, M_COMPRESSED, M_HOST, M_KEEP, M_RECOMPUTE,
                                 M_SELECTIVE, POLICIES)
from ..strategy.shard_levels import OPTIMIZERS
from .arrays import GraphArrays
from .records import (A_BWD, A_COMPRESS, A_DECOMP, A_FWD, A_GXFER, A_OFFLOAD, A_OPT,
                      A_PREFETCH, A_RECOMP, A_XFER, END, START, Copies, Copy, Placed, anchors,
                      placements)
from .jit import njit
from .segments import holding_segments, segment_starts
from .states import unit_states

__all__ = ["StepBlocks", "Copy", "Copies", "BlockTable", "step_blocks", "placement_key",
           "CATEGORIES", "OPTIMIZER_STATES", "A_FWD", "A_BWD", "A_RECOMP", "A_OFFLOAD",
           "A_PREFETCH", "A_COMPRESS", "A_DECOMP", "A_XFER", "A_GXFER", "A_OPT"]

CATEGORIES = ("weights", "gradients", "optimizer", "activations", "transient", "communication")
WEIGHTS, GRADIENTS, OPTIMIZER, ACTIVATIONS, TRANSIENT, COMMUNICATION = range(len(CATEGORIES))
SLOTS = ("produced", "stored", "restored", "rematerialized")
"""The block rows of one record: the storage as produced (or copied), its stored copy
(compressed on the device or offloaded to the host), the copy restored before backward, and
the storage re-materialized by its segment's recomputation."""
PRODUCED, STORED, RESTORED, REMAT = range(len(SLOTS))
UNIT_SLOTS = ("forward temporaries", "backward temporaries", "recompute temporaries",
              "parameter gradients", "cached outputs")
"""The block rows of one unit; "cached outputs" are a selective unit's expensive outputs
used only inside it, held from its forward to its recomputation."""
FWD_TMP, BWD_TMP, REC_TMP, PARAM_GRAD, CACHED = range(len(UNIT_SLOTS))
FIRST_MB, EVERY_MB = 0, 1
STATE_SLOTS = {"gathered for forward": (COMMUNICATION, EVERY_MB),
               "gathered for backward": (COMMUNICATION, EVERY_MB),
               "gathered for recompute": (COMMUNICATION, EVERY_MB),
               "unsharded gradients": (COMMUNICATION, EVERY_MB),
               "host optimizer state": (OPTIMIZER, FIRST_MB)}
"""The model-state block rows of one unit (:mod:`memflow.memory.states`), each with its
category and whether it recurs every micro-batch: zero bytes unless the unit is sharded or
offloads its optimizer. Gathered parameters and a gradient before its reduce-scatter are
short-lived communication buffers (ZeRO's "temporary buffers"), not model states."""
GATHER_FWD, GATHER_BWD, GATHER_REC, UNSHARDED, HOST_STATE = range(len(STATE_SLOTS))
NS, NU, NM = len(SLOTS), len(UNIT_SLOTS), len(STATE_SLOTS)
OPTIMIZER_STATES = {k: n * (w or 4) / 4 for k, (n, w) in OPTIMIZERS.items()}
"""Optimizer state bytes per fp32 trainable byte (:data:`memflow.strategy.OPTIMIZERS`;
``adam8bit``: 0.5)."""
NONE = -1           # a record no saver on its placement holds
N_MECH = len(MECHANISMS)


class StepBlocks:
    """Blocks (one entry per block in each array) plus the copies between placements.

    Made from the fixed rows of a :class:`BlockTable` (``rows``: their arrays, a snapshot of
    the policy-dependent ones); the arrays below keep the rows that hold bytes.
    """

    def __init__(self, rows: dict[str, np.ndarray], copies: Copies, offloaded: np.ndarray,
                 compressed: np.ndarray, persistent: np.ndarray, segment: np.ndarray,
                 segment_start: np.ndarray, microbatches: int):
        self.rows = rows
        self.segment = segment            # the recompute segments that run (holding_segments)
        self.segment_start = segment_start    # segment_starts(segment)
        self.microbatches = microbatches
        self.copies = copies
        self.offloaded = offloaded        # per unit: bytes per part its offload task moves
        self.compressed = compressed      # per unit: bytes per part its compress task reads
        self.persistent = persistent      # (layouts, categories) bytes per part, whole step

    @cached_property
    def _kept(self) -> np.ndarray:
        return self.rows["bytes"] > 0

    def _column(self, name: str) -> np.ndarray:
        return self.rows[name][self._kept]

    @cached_property
    def layout(self) -> np.ndarray:
        return self._column("layout")

    @cached_property
    def on_host(self) -> np.ndarray:
        return self._column("host")

    @cached_property
    def bytes(self) -> np.ndarray:
        return self._column("bytes")

    @cached_property
    def category(self) -> np.ndarray:
        return self._column("category")

    @cached_property
    def per_mb(self) -> np.ndarray:
        """EVERY_MB: one block per micro-batch; FIRST_MB: one per step."""
        return self._column("per_mb")

    @cached_property
    def alloc(self) -> np.ndarray:
        """(k, 3) anchors."""
        return self._column("alloc")

    @cached_property
    def free(self) -> np.ndarray:
        """(k, 3, 3) anchors: freed at the latest of the three."""
        return self._column("free")

    def held_for_backward(self) -> tuple[np.ndarray, np.ndarray]:
        """Bytes per part held for backward at the end of the forward, per placement:
        ``(on the device, on the host)``, every micro-batch's (GPipe holds them all).

        On the device: activations allocated in the forward (by a forward, a transfer, an
        offload or compress task) and held until a backward ends (``keep``, segment inputs),
        and compressed copies; on the host: offloaded copies.

        >>> import pandas as pd
        >>> from memflow.graph import OpGraph
        >>> from memflow.memory.arrays import graph_arrays
        >>> g = OpGraph(pd.DataFrame({"fwd_flops": [1.0, 1.0], "bwd_flops": [2.0, 2.0]},
        ...                          index=["a", "b"]),
        ...             pd.DataFrame({"bytes": [100, 200, 300], "producer": ["<input>", "a", "b"],
        ...                           "consumers": [["a"], ["b"], []],
        ...                           "savers": [["a"], ["b"], []], "is_output": [0, 0, 1]}))
        >>> from memflow.strategy import KEEP, OFFLOAD
        >>> plan = step_blocks(graph_arrays(g), np.array([KEEP, OFFLOAD]), np.array([-1, -1]),
        ...                    np.zeros(2, np.int64), np.ones((1, 3), np.int64), 1, np.ones(2))
        >>> [a.tolist() for a in plan.held_for_backward()]     # t0 kept; t1 on the host
        [[100.0], [200.0]]
        """
        alloc = self.alloc[:, 0]
        in_forward = np.isin(alloc, (A_FWD, A_XFER, A_COMPRESS, A_OFFLOAD))
        to_backward = ((self.free[:, :, 0] == A_BWD) | (self.free[:, :, 0] == A_RECOMP)).any(1)
        act = self.category == ACTIVATIONS
        device = act & ~self.on_host & in_forward & (to_backward | (alloc == A_COMPRESS))
        host = act & self.on_host & (alloc == A_OFFLOAD)
        b = self.bytes * np.where(self.per_mb == EVERY_MB, self.microbatches, 1)
        n = len(self.persistent)
        return (np.bincount(self.layout[device], b[device], n),
                np.bincount(self.layout[host], b[host], n))


def _anchor(kind, key, edge, k: int) -> np.ndarray:
    """``k`` anchors ``(kind, key, edge)`` (each a number or an array of ``k``)."""
    out = np.empty((k, 3), np.int64)
    out[:, 0], out[:, 1], out[:, 2] = kind, key, edge
    return out


@njit
def _set(a, row, slot, kind, key, edge):
    a[row, slot, 0], a[row, slot, 1], a[row, slot, 2] = kind, key, edge


def _per_tensor_adam(sizes: np.ndarray) -> float:
    """Peak temporaries of PyTorch's per-tensor Adam over parameters of ``sizes`` in order:
    ``sqrt(v)`` and its quotient (two of the parameter's size) while the loop variable
    ``denom`` still holds the previous parameter's.

    >>> _per_tensor_adam(np.array([4.0, 4.0, 1.0]))
    12.0
    """
    sizes = sizes[sizes > 0]
    if not len(sizes):
        return 0.0
    return float((2 * sizes + np.concatenate([[0.0], sizes[:-1]])).max())


@njit
def _replan(pol, start, ratio, old_pol, old_start, old_ratio, first, touched_ptr, touched,
            sv_ptr, sv, m_ptr, m, r_ptr, r, prod, home, nbytes, kept_output, rec_alloc,
            fwd_free, last_xfer, expensive, n_units, unit_row, recompute_tmp, cached, bytes_,
            host, alloc, free, carrier, compress, mark, offloaded, compressed):
    """Re-derive the slots of the records whose rules read a unit whose policy, segment start
    or ratio changed (every record when ``first``); then the units' recomputation
    temporaries and the bytes each unit offloads and compresses. ``pol`` is per unit the
    *mechanism* of its policy (an index of :data:`MECHANISMS`), not the policy's code."""
    R = len(prod)
    far = np.iinfo(np.int64).max
    n_recs = 0
    if first:
        for x in range(R):
            mark[x] = True
        n_recs = R
    else:
        for u in range(n_units):
            if pol[u] != old_pol[u] or start[u] != old_start[u] or ratio[u] != old_ratio[u]:
                for j in range(touched_ptr[u], touched_ptr[u + 1]):
                    if not mark[touched[j]]:
                        mark[touched[j]] = True
                        n_recs += 1
    for x in range(R):
        if not mark[x]:
            continue
        mark[x] = False
        has = np.zeros(N_MECH, np.bool_)
        first_saver = -1
        for j in range(sv_ptr[x], sv_ptr[x + 1]):
            has[pol[sv[j]]] = True
            if first_saver < 0:
                first_saver = sv[j]          # rows ascend: the first is the least
        p = prod[x]
        own = start[p] if home[x] and p >= 0 else -2
        # a member in a recompute segment the storage comes into from outside: a segment input
        seg_in = far
        for j in range(m_ptr[x], m_ptr[x + 1]):
            st = start[m[j]]
            if st >= 0 and st != own and st < seg_in:
                seg_in = st
        # made by an expensive op of a selective unit: cached until the unit's backward
        sel = home[x] and p >= 0 and expensive[x] and pol[p] == M_SELECTIVE and own >= 0
        keep = has[M_KEEP] or seg_in < far or sel
        state = NONE               # the first mechanism (in MECHANISMS' order) any saver uses
        if keep:
            state = M_KEEP
        else:
            for k in range(N_MECH):
                if has[k]:
                    state = k
                    break
        held = state == M_COMPRESSED or state == M_HOST
        c = -1
        for j in range(sv_ptr[x], sv_ptr[x + 1]):
            if pol[sv[j]] == state and sv[j] > c:
                c = sv[j]
        go = A_COMPRESS if state == M_COMPRESSED else A_OFFLOAD
        back = A_DECOMP if state == M_COMPRESSED else A_PREFETCH
        cc = max(c, 0)
        row = NS * x
        b = nbytes[x]
        # main: the storage as produced (or copied), until the policy lets it go
        bytes_[row] = b
        if keep:
            hold = min(first_saver if first_saver >= 0 else far, seg_in, p if sel else far)
            for j in range(3):
                _set(free, row, j, A_BWD, hold, START)
        else:
            for j in range(3):
                _set(free, row, j, fwd_free[x, 0], fwd_free[x, 1], fwd_free[x, 2])
        if held:
            _set(free, row, 1, go, cc, END)
        elif kept_output[x]:
            _set(free, row, 1, A_BWD, 0, END)
        if last_xfer[x, 0] >= 0:            # the original stays until every copy has left
            _set(free, row, 2, last_xfer[x, 0], last_xfer[x, 1], last_xfer[x, 2])
        # stored (compressed on the device, or offloaded to the host); restored before backward
        bytes_[row + STORED] = (b / ratio[cc] if state == M_COMPRESSED else b) if held else 0.0
        host[row + STORED] = state == M_HOST
        alloc[row + STORED, 0], alloc[row + STORED, 1], alloc[row + STORED, 2] = go, cc, START
        bytes_[row + RESTORED] = b if held else 0.0
        alloc[row + RESTORED, 0], alloc[row + RESTORED, 1], alloc[row + RESTORED, 2] = back, cc, START
        for j in range(3):
            _set(free, row + STORED, j, back, cc, END)
            _set(free, row + RESTORED, j, A_BWD, max(first_saver, 0), START)
        # re-materialized by its segment's recomputation
        replayed = state == M_RECOMPUTE or state == M_SELECTIVE
        remat = own >= 0 and (replayed or state == NONE)
        last_in = -1
        for j in range(r_ptr[x], r_ptr[x + 1]):
            if start[r[j]] == own and r[j] > last_in:
                last_in = r[j]
        bytes_[row + REMAT] = b if remat else 0.0
        alloc[row + REMAT, 0], alloc[row + REMAT, 1], alloc[row + REMAT, 2] = A_RECOMP, max(p, 0), START
        for j in range(3):
            if replayed:
                _set(free, row + REMAT, j, A_BWD, max(first_saver, 0), START)
            else:
                _set(free, row + REMAT, j, A_RECOMP, last_in if last_in >= 0 else max(p, 0), END)
        carrier[x] = c if held else -1
        compress[x] = state == M_COMPRESSED
    for u in range(n_units):
        bytes_[unit_row + NU * u + REC_TMP] = recompute_tmp[u] if start[u] >= 0 else 0.0
        bytes_[unit_row + NU * u + CACHED] = (cached[u] if start[u] >= 0
                                              and pol[u] == M_SELECTIVE else 0.0)
        offloaded[u] = 0.0
        compressed[u] = 0.0
    for x in range(R):        # summed in record order, whatever changed
        if carrier[x] >= 0:
            if compress[x]:
                compressed[carrier[x]] += nbytes[x]
            else:
                offloaded[carrier[x]] += nbytes[x]
    return n_recs


def _parameter_gradients(ga: GraphArrays, layout: np.ndarray,
                         gradients: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per unit, the parameter-gradient bytes its backward makes and the unit at whose
    backward's end they exist. A parameter's gradient appears with the backward of its last
    reader (the first to run), on its owner's placement: ``gradients`` (per owner) is shared
    out over its parameters by their bytes and charged to that reader when the reader is on the
    owner's placement, else to the owner at the earliest such backward of its parameters.

    >>> import pandas as pd
    >>> from memflow.graph import OpGraph
    >>> from memflow.memory.arrays import graph_arrays
    >>> g = OpGraph(pd.DataFrame({"fwd_flops": [1.0, 1.0], "bwd_flops": [2.0, 2.0],
    ...                           "param_bytes": [400.0, 0.0], "trainable_bytes": [400.0, 0.0]},
    ...                          index=["a", "b"]),
    ...             pd.DataFrame({"bytes": [8], "producer": ["<input>"], "consumers": [["a"]]}))
    >>> [x.tolist() for x in _parameter_gradients(graph_arrays(g), np.zeros(2, np.int64),
    ...                                           np.array([400.0, 0.0]))]
    [[400.0, 0.0], [0, 1]]
    """
    k = ga.param_grad_bytes > 0
    owner, unit, b = ga.param_owner[k], ga.param_grad_unit[k], ga.param_grad_bytes[k]
    total = np.bincount(owner, b, ga.n)
    share = gradients[owner] * b / total[owner]
    moves = layout[unit] == layout[owner]
    out = np.where(total > 0, 0.0, gradients)
    np.add.at(out, np.where(moves, unit, owner), share)
    at = np.arange(ga.n)
    np.maximum.at(at, owner[~moves], unit[~moves])
    return out, at


_ANCHORS: dict[int, tuple[np.ndarray, ...]] = {}


def _unit_anchors(ga: GraphArrays) -> tuple[np.ndarray, ...]:
    """Anchors of the unit rows and the model-state rows that no placement changes (all but
    the parameter gradients' and those ending at the optimizer step of the unit's layout):
    ``(unit alloc, unit free, state alloc, state free)``, made once per number of units; a
    search had rebuilt them for every placement."""
    hit = _ANCHORS.get(ga.n)
    if hit is not None:
        return hit
    n, units = ga.n, np.arange(ga.n)
    ua, uf = np.zeros((NU * n, 3), np.int64), np.zeros((NU * n, 3, 3), np.int64)
    for slot, kind in ((FWD_TMP, A_FWD), (BWD_TMP, A_BWD), (REC_TMP, A_RECOMP)):
        ua[slot::NU] = _anchor(kind, units, START, n)
        uf[slot::NU] = _anchor(kind, units, END, n)[:, None, :]
    ua[CACHED::NU] = _anchor(A_FWD, units, END, n)
    uf[CACHED::NU] = _anchor(A_RECOMP, units, END, n)[:, None, :]
    sa, sf = np.zeros((NM * n, 3), np.int64), np.zeros((NM * n, 3, 3), np.int64)
    for j, kind in ((GATHER_FWD, A_FWD), (GATHER_BWD, A_BWD), (GATHER_REC, A_RECOMP),
                    (UNSHARDED, A_BWD)):
        sa[j::NM] = _anchor(kind, units, START, n)
        sf[j::NM] = _anchor(kind, units, END, n)[:, None, :]
    sa[HOST_STATE::NM] = _anchor(A_FWD, units, START, n)
    for x in (ua, uf, sa, sf):
        x.flags.writeable = False
    if len(_ANCHORS) > 16:        # unit counts of graphs long gone
        _ANCHORS.clear()
    hit = _ANCHORS[n] = (ua, uf, sa, sf)
    return hit


class BlockTable:
    """Every block of one placement's plan, in fixed rows, re-derived by delta.

    Rows: four *slots* per record (the storage as produced, its compressed or offloaded
    copy, the copy restored before backward, the storage re-materialized by recomputation),
    then the gradient blocks of the placement, four per unit (forward, backward and
    recomputation temporaries, parameter gradients), the optimizer's temporaries, then the
    model-state blocks of the units, five per unit (:data:`STATE_SLOTS`). Rows
    that do not apply hold 0 bytes and are left out of the :class:`StepBlocks`.
    :meth:`derive` re-derives only the records whose rules read a unit whose policy, segment or
    compression ratio changed since the previous call.
    """

    def __init__(self, ga: GraphArrays, placed: Placed, layout: np.ndarray, degrees: np.ndarray,
                 microbatches: int, *, optimizer: str = "sgd", foreach: bool = True,
                 precision: str | None = None, shard: np.ndarray | None = None,
                 offload: np.ndarray | None = None):
        n, M, P = ga.n, int(microbatches), placed
        R, G, L = len(P.tensor), len(P.grad_bytes), len(degrees)
        s, p, a = degrees[layout, 0], degrees[layout, 1], degrees[layout, 2]
        per = 1.0 / (s * p * a) / M
        o_lay = np.arange(L) if optimizer == "adam" else np.zeros(0, np.int64)
        self.unit_row = NS * R + G
        unit_slots = np.arange(NU)     # parameter gradients: one per step; the rest per micro-batch
        self.state_row = self.unit_row + NU * n + len(o_lay)
        k = self.state_row + NM * n
        self.placed, self.n, self.microbatches = P, n, M
        self.saves = np.zeros(n, bool)
        self.saves[ga.savers_idx] = True
        self.static = {
            "layout": np.concatenate([np.repeat(P.layout, NS), P.grad_layout, np.repeat(layout, NU),
                                      o_lay, np.repeat(layout, NM)]).astype(np.int64),
            "category": np.concatenate([np.full(NS * R, ACTIVATIONS), np.full(G, TRANSIENT),
                                        np.tile(np.select([unit_slots == PARAM_GRAD,
                                                           unit_slots == CACHED],
                                                          [GRADIENTS, ACTIVATIONS], TRANSIENT), n),
                                        np.full(len(o_lay), TRANSIENT),
                                        np.tile([c for c, _ in STATE_SLOTS.values()], n)]).astype(np.int64),
            "per_mb": np.concatenate([np.full(NS * R + G, EVERY_MB),
                                      np.tile(np.where(unit_slots == PARAM_GRAD, FIRST_MB, EVERY_MB), n),
                                      np.full(len(o_lay), FIRST_MB),
                                      np.tile([m for _, m in STATE_SLOTS.values()], n)]).astype(np.int64)}
        self.bytes = np.zeros(k)
        self.host = np.zeros(k, bool)
        self.alloc = np.zeros((k, 3), np.int64)
        self.free = np.zeros((k, 3, 3), np.int64)
        self.alloc[PRODUCED:NS * R:NS] = P.alloc
        g = slice(NS * R, NS * R + G)
        self.bytes[g], self.alloc[g] = P.grad_bytes, P.grad_alloc
        self.free[g] = P.grad_free[:, None, :]
        u = self.unit_row
        self.recompute_tmp = ga.fwd_tmp * per
        self.cached = ga.cached * per
        self.expensive = ga.expensive[P.tensor]
        # a tied weight's contributions are in bwd_tmp: the one waiting for the others is a
        # gradient alive between backwards, the sum the reader that adds it in makes its own
        bwd_tmp = ga.bwd_tmp * per
        by_slot = {FWD_TMP: ga.fwd_tmp * per, BWD_TMP: bwd_tmp, REC_TMP: np.zeros(n),
                   PARAM_GRAD: np.zeros(n), CACHED: np.zeros(n)}    # _set_states: gradients
        self.bytes[u:u + NU * n] = np.stack([by_slot[j] for j in range(NU)], 1).ravel()
        self.alloc[u:u + NU * n], self.free[u:u + NU * n] = _unit_anchors(ga)[:2]
        grads = slice(u + PARAM_GRAD, u + NU * n, NU)
        self.free[grads] = _anchor(A_OPT, layout, END, n)[:, None, :]
        o = slice(u + NU * n, self.state_row)
        self.alloc[o] = _anchor(A_OPT, o_lay, START, len(o_lay))
        self.free[o] = _anchor(A_OPT, o_lay, END, len(o_lay))[:, None, :]
        self.carrier = np.full(R, -1)      # per record: the unit whose task offloads/compresses it
        self.compress = np.zeros(R, bool)
        self._mark = np.zeros(R, bool)
        self._key: tuple[np.ndarray, ...] | None = None
        self._set_states(ga, layout, degrees, optimizer, foreach, precision, shard, offload)

    def _set_states(self, ga: GraphArrays, layout: np.ndarray, degrees: np.ndarray,
                    optimizer: str, foreach: bool, precision: str | None,
                    shard: np.ndarray | None, offload: np.ndarray | None) -> None:
        """The rows and persistent bytes the units' model states decide (parameter gradients,
        the optimizer's temporaries, the model-state rows); no record's rows read them."""
        n, u, L = self.n, self.unit_row, len(degrees)
        s, p, a = degrees[layout, 0], degrees[layout, 1], degrees[layout, 2]
        st = self.states = unit_states(ga, s, p, a, shard, offload, precision, optimizer)
        # parameter gradients: their bytes follow the states, the backward they appear at the layout
        grads = slice(u + PARAM_GRAD, u + NU * n, NU)
        self.bytes[grads], grad_at = _parameter_gradients(ga, layout, st.gradients)
        self.alloc[grads] = _anchor(A_BWD, grad_at, END, n)
        # optimizer-step temporaries: Adam's sqrt(v) buffer, all at once (foreach) or per tensor
        o_lay = np.arange(L) if optimizer == "adam" else np.zeros(0, np.int64)
        p_train = ga.param_grad_bytes / p[ga.param_owner] * st.state_factor[ga.param_owner]
        p_lay = layout[ga.param_owner]
        o_b = np.array([p_train[p_lay == lay].sum() if foreach
                        else _per_tensor_adam(p_train[p_lay == lay]) for lay in o_lay])
        self.bytes[u + NU * n:self.state_row] = o_b.reshape(-1)
        self._state_blocks(layout, st, _unit_anchors(ga))
        self.persistent = np.zeros((L, len(CATEGORIES)))
        np.add.at(self.persistent[:, WEIGHTS], layout, st.weights)
        np.add.at(self.persistent[:, OPTIMIZER], layout, st.optimizer)
        np.add.at(self.persistent[:, COMMUNICATION], layout, st.bucket)

    def with_states(self, ga: GraphArrays, layout: np.ndarray, degrees: np.ndarray, *,
                    optimizer: str = "sgd", foreach: bool = True, precision: str | None = None,
                    shard: np.ndarray | None = None,
                    offload: np.ndarray | None = None) -> "BlockTable":
        """This table (same graph arrays, records, layouts and precision) with other shard
        levels or optimizer places: the model-state rows re-made, the records' rows and the
        last plan kept, so the next :meth:`derive` is by delta (a search's shard move)."""
        new = object.__new__(BlockTable)
        new.__dict__.update(self.__dict__)
        for name in ("bytes", "host", "alloc", "free", "carrier", "compress", "_mark"):
            setattr(new, name, getattr(self, name).copy())
        new._set_states(ga, layout, degrees, optimizer, foreach, precision, shard, offload)
        return new

    def _state_blocks(self, layout: np.ndarray, st, anchors: tuple[np.ndarray, ...]) -> None:
        """The model-state rows: gathered parameters around each forward, backward and
        recomputation of the unit (:meth:`derive` keeps the last where it recomputes); its full gradient during its backward (until the
        reduce-scatter that ends it); its optimizer state on the host over the step (from the
        unit's first forward to the end of the optimizer step)."""
        n, r = self.n, self.state_row
        for j, b in ((GATHER_FWD, st.gathered), (GATHER_BWD, st.gathered),
                     (GATHER_REC, st.gathered), (UNSHARDED, st.unsharded)):
            self.bytes[r + j:r + NM * n:NM] = b
        self.alloc[r:r + NM * n], self.free[r:r + NM * n] = anchors[2], anchors[3]
        h = slice(r + HOST_STATE, r + NM * n, NM)
        self.bytes[h], self.host[h] = st.host, True
        self.free[h] = _anchor(A_OPT, layout, END, n)[:, None, :]

    def derive(self, policy: np.ndarray, segment: np.ndarray, ratio: np.ndarray) -> StepBlocks:
        """The blocks of ``policy`` (per unit), ``segment`` (recompute segment per unit) and
        ``ratio`` (compression ratio per unit, used where the policy is compress)."""
        P = self.placed
        # the kernel works on mechanisms: policies sharing one share its memory rule
        pol = POLICIES.mechanism_codes[np.asarray(policy, np.int64)]
        segment = holding_segments(segment, self.saves)
        start = segment_starts(segment)
        ratio = np.asarray(ratio, np.float64)
        old = self._key or (pol, start, ratio)
        offloaded, compressed = np.empty(self.n), np.empty(self.n)
        _replan(pol, start, ratio, *old, self._key is None, *P.touched, *P.savers, *P.members,
                *P.readers, P.prod, P.home, P.nbytes, P.kept_output, P.alloc, P.fwd_free,
                P.last_xfer, self.expensive, self.n, self.unit_row, self.recompute_tmp,
                self.cached, self.bytes, self.host, self.alloc, self.free, self.carrier,
                self.compress, self._mark, offloaded, compressed)
        self._key = (pol, start, ratio)
        # gathered parameters for a recomputation: only where the unit is recomputed
        self.bytes[self.state_row + GATHER_REC:self.state_row + NM * self.n:NM] = np.where(
            start >= 0, self.states.gathered, 0.0)
        rows = {**self.static, "bytes": self.bytes.copy(), "host": self.host.copy(),
                "alloc": self.alloc.copy(), "free": self.free.copy()}
        return StepBlocks(rows, P.copies, offloaded, compressed, self.persistent, segment,
                          start, self.microbatches)


def placement_key(layout: np.ndarray, degrees: np.ndarray, microbatches: int,
                  sequence: np.ndarray | None = None) -> tuple:
    """The key under which :func:`step_blocks` keeps a placement's records in its ``cache``:
    what :func:`~memflow.memory.records.placements` depends on besides the graph."""
    return (layout.tobytes(), degrees.tobytes(), int(microbatches),
            None if sequence is None else sequence.tobytes())


def step_blocks(ga: GraphArrays, policy: np.ndarray, segment: np.ndarray, layout: np.ndarray,
                degrees: np.ndarray, microbatches: int, ratio: np.ndarray, *,
                optimizer: str = "sgd", foreach: bool = True, cache: dict | None = None,
                precision: str | None = None, shard: np.ndarray | None = None,
                offload: np.ndarray | None = None,
                sequence: np.ndarray | None = None) -> StepBlocks:
    """The blocks of one training step.

    ``degrees`` is ``(layouts, 3)``: sample, parameter, attribute of each layout; ``layout``,
    ``policy``, ``segment`` and ``ratio`` (compression ratio, used where ``policy`` is
    compress) are per unit. ``foreach`` selects PyTorch's multi-tensor optimizer kernels (the
    CUDA default: one optimizer-sized temporary for Adam) over the per-parameter loop (CPU).
    ``cache`` (a dict the caller keeps) holds what the placements alone decide, so strategies
    that differ in memory policies only share it. ``precision``, ``shard`` and ``offload``
    (per unit: shard level code, optimizer on the host) decide the model states
    (:func:`memflow.memory.states.unit_states`). ``sequence`` (per unit) is the strategy's
    sequence parallelism (:func:`memflow.memory.records.placements`).
    """
    key = placement_key(layout, degrees, microbatches, sequence)
    placed = cache.get(key) if cache is not None else None
    if placed is None:
        placed = placements(ga, layout, (degrees[layout, 0] * degrees[layout, 2]).astype(np.float64),
                            degrees[layout, 1], microbatches, sequence=sequence)
        if cache is not None:
            cache[key] = placed
    table = BlockTable(ga, placed, layout, degrees, microbatches, optimizer=optimizer,
                       foreach=foreach, precision=precision, shard=shard, offload=offload)
    return table.derive(policy, segment, ratio)
