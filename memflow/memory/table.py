"""The block table of one placement: every block of its plan in fixed rows, the rows the
placement and the model states fix made once, the policy-dependent ones re-derived by delta
(:func:`memflow.memory.replan.replan`)."""
from __future__ import annotations

import functools
import weakref

import numpy as np

from ..graph.mapkind import MAP_KINDS, UNCOMPRESSED, kind_code
from ..strategy.policies import POLICIES
from .arrays import GraphArrays
from .jit import njit
from .plan import StepBlocks
from .records import A_BWD, A_FWD, A_OPT, A_RECOMP, END, START, Placed
from .replan import replan
from .segments import holding_segments, segment_starts
from .slots import (ACTIVATIONS, BWD_TMP, CACHED, CATEGORIES, COMMUNICATION, EVERY_MB,
                    FIRST_MB, FWD_TMP, GATHER_BWD, GATHER_FWD, GATHER_REC, GRADIENTS,
                    HOST_STATE, NM, NS, NU, OPTIMIZER, PARAM_GRAD, PRODUCED, REC_TMP,
                    RESTORED, STATE_SLOTS, STORED, TRANSIENT, UNSHARDED, WEIGHTS, _anchor, _set)
from .states import unit_states

__all__ = ["BlockTable"]


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
    return _gradient_pass(ga.param_owner, ga.param_grad_unit, ga.param_grad_bytes,
                          np.asarray(layout, np.int64), gradients)


@njit
def _gradient_pass(owner, unit, nbytes, layout, gradients):
    """:func:`_parameter_gradients` as one compiled pass over the parameters (as numpy
    expressions, ~15 calls per new placement of a search): the owners' totals and the
    shares are summed in parameter order, as ``np.bincount`` and ``np.add.at`` sum them (the
    same bits)."""
    n = len(gradients)
    total = np.zeros(n)
    for j in range(len(owner)):
        if nbytes[j] > 0:
            total[owner[j]] += nbytes[j]
    out = np.empty(n)
    for i in range(n):
        out[i] = 0.0 if total[i] > 0 else gradients[i]
    at = np.arange(n)
    for j in range(len(owner)):
        if nbytes[j] > 0:
            o, u = owner[j], unit[j]
            share = gradients[o] * nbytes[j] / total[o]
            if layout[u] == layout[o]:
                out[u] += share
            else:
                out[o] += share
                at[o] = max(at[o], u)
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


@functools.lru_cache(maxsize=16)
def _unit_columns(n: int, optimizer_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Category and per-micro-batch columns of the unit rows, the optimizer's rows and the
    model-state rows of ``n`` units: no placement changes them (a search had tiled them
    for every placement)."""
    unit_slots = np.arange(NU)     # parameter gradients: one per step; the rest per micro-batch
    category = np.concatenate([
        np.tile(np.select([unit_slots == PARAM_GRAD, unit_slots == CACHED],
                          [GRADIENTS, ACTIVATIONS], TRANSIENT), n),
        np.full(optimizer_rows, TRANSIENT),
        np.tile([c for c, _ in STATE_SLOTS.values()], n)]).astype(np.int64)
    per_mb = np.concatenate([np.tile(np.where(unit_slots == PARAM_GRAD, FIRST_MB, EVERY_MB), n),
                             np.full(optimizer_rows, FIRST_MB),
                             np.tile([m for _, m in STATE_SLOTS.values()], n)]).astype(np.int64)
    category.flags.writeable = per_mb.flags.writeable = False
    return category, per_mb


_SAVED: dict[int, tuple] = {}


def _saved(ga: GraphArrays) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per unit, whether it saves a storage, and the bytes of each map kind it saves
    (weights its unpacked bytes' ratio); per tensor, the kind its record is charged as: graph
    constants, made once per graph arrays (a search had made them for every placement).

    The step's inputs are charged as a kind no compressor packs: the caller holds them
    through the step, so export packs none."""
    hit = _SAVED.get(id(ga))
    if hit is not None and hit[0]() is ga:
        return hit[1]
    saves = np.zeros(ga.n, bool)
    saves[ga.savers_idx] = True
    kind = np.where(ga.producer < 0, kind_code(min(UNCOMPRESSED)), ga.map_kind)
    by_kind = np.zeros((ga.n, len(MAP_KINDS)))
    owners = np.repeat(np.arange(len(ga.bytes)), np.diff(ga.savers_ptr))
    np.add.at(by_kind, (ga.savers_idx, kind[owners]), ga.bytes[owners])
    saves.flags.writeable = by_kind.flags.writeable = kind.flags.writeable = False
    if len(_SAVED) > 16:        # graph arrays long gone
        _SAVED.clear()
    _SAVED[id(ga)] = (weakref.ref(ga), (saves, by_kind, kind))
    return saves, by_kind, kind


_STATES: dict[tuple, tuple] = {}


def _unit_states(ga: GraphArrays, s: np.ndarray, p: np.ndarray, a: np.ndarray, shard, offload,
                 precision: str | None, optimizer: str):
    """:func:`~memflow.memory.states.unit_states`, kept per units' degrees and model states:
    a search's swap and copy moves re-place units on other devices with the same degrees,
    and the states read no device."""
    key = (id(ga), s.tobytes(), p.tobytes(), a.tobytes(),
           None if shard is None else np.asarray(shard, np.int64).tobytes(),
           None if offload is None else np.asarray(offload, bool).tobytes(), precision, optimizer)
    hit = _STATES.get(key)
    if hit is not None and hit[0]() is ga:
        return hit[1]
    st = unit_states(ga, s, p, a, shard, offload, precision, optimizer)
    for x in vars(st).values():
        x.flags.writeable = False
    if len(_STATES) > 256:        # degrees seen long ago
        _STATES.clear()
    _STATES[key] = (weakref.ref(ga), st)
    return st


@njit
def _fixed_rows(rec_layout, rec_alloc, rec_tensor, grad_layout, grad_bytes, grad_alloc,
                grad_free, layout, degrees, microbatches, n_opt, fwd_tmp, cached, bwd_tmp,
                unpack_tmp, unpack_done, expensive, kinds, unit_alloc, unit_free, state_alloc,
                state_free, unit_category, unit_per_mb):
    """The rows no policy and no model state decides (:class:`BlockTable`), as one compiled
    pass of element loops, each element written once (as numpy expressions these were ~60
    calls per new placement of a search, and as row slices thousands of small copies into
    zeroed arrays). Returns the static ``layout``, ``category`` and ``per_mb`` columns;
    ``bytes``, ``host``, ``alloc``, ``free`` with the records', gradients', units' and model
    states' fixed rows written (the policy's slots 0 until :func:`replan`; the parameter
    gradients' allocation and the states' bytes are :func:`_state_rows`'); per unit, the
    rows of its recomputation, cached-output, backward and unpacking bytes per part and
    micro-batch (:class:`BlockTable`'s ``recompute_tmp``, ``cached``, ``bwd_tmp``,
    ``unpack_tmp``, ``unpack_done``); per record, whether an expensive op made it, and its
    map kind."""
    R, G, n = len(rec_layout), len(grad_layout), len(layout)
    u = NS * R + G
    state_row = u + NU * n + n_opt
    k = state_row + NM * n
    lay = np.empty(k, np.int64)
    category = np.empty(k, np.int64)
    per_mb = np.empty(k, np.int64)
    nbytes = np.zeros(k)
    host = np.zeros(k, np.bool_)
    alloc = np.empty((k, 3), np.int64)
    free = np.empty((k, 3, 3), np.int64)
    per_unit = np.empty((5, n))
    for i in range(n):
        d = layout[i]
        per = 1.0 / (degrees[d, 0] * degrees[d, 1] * degrees[d, 2]) / microbatches
        per_unit[0, i] = fwd_tmp[i] * per
        per_unit[1, i] = cached[i] * per
        per_unit[2, i] = bwd_tmp[i] * per
        per_unit[3, i] = -1.0 if unpack_tmp[i] < 0 else unpack_tmp[i] * per
        per_unit[4, i] = unpack_done[i] * per
    for r in range(R):
        for j in range(NS):
            row = NS * r + j
            lay[row], category[row], per_mb[row] = rec_layout[r], ACTIVATIONS, EVERY_MB
            for c in range(3):
                alloc[row, c] = rec_alloc[r, c] if j == PRODUCED else 0
                for e in range(3):
                    free[row, e, c] = 0
    for g in range(G):
        row = NS * R + g
        lay[row], nbytes[row] = grad_layout[g], grad_bytes[g]
        category[row], per_mb[row] = TRANSIENT, EVERY_MB
        for c in range(3):
            alloc[row, c] = grad_alloc[g, c]
            for e in range(3):
                free[row, e, c] = grad_free[g, c]
    for x in range(k - u):
        category[u + x], per_mb[u + x] = unit_category[x], unit_per_mb[x]
    for i in range(n):
        for j in range(NU):
            row, x = u + NU * i + j, NU * i + j
            lay[row] = layout[i]
            for c in range(3):
                alloc[row, c] = unit_alloc[x, c]
            if j == PARAM_GRAD:
                for e in range(3):
                    _set(free, row, e, A_OPT, layout[i], END)
            else:
                for e in range(3):
                    for c in range(3):
                        free[row, e, c] = unit_free[x, e, c]
        nbytes[u + NU * i + FWD_TMP] = per_unit[0, i]
        nbytes[u + NU * i + BWD_TMP] = per_unit[2, i]
        # the model-state rows: their anchors (the host state's to the optimizer step of the
        # unit's layout); their bytes are the states' (_state_rows)
        for j in range(NM):
            row, x = state_row + NM * i + j, NM * i + j
            lay[row] = layout[i]
            for c in range(3):
                alloc[row, c] = state_alloc[x, c]
                for e in range(3):
                    free[row, e, c] = state_free[x, e, c]
        host[state_row + NM * i + HOST_STATE] = True
        for e in range(3):
            _set(free, state_row + NM * i + HOST_STATE, e, A_OPT, layout[i], END)
    for o in range(n_opt):
        row = u + NU * n + o
        lay[row] = o
        for e in range(3):
            _set(free, row, e, A_OPT, o, END)
        alloc[row, 0], alloc[row, 1], alloc[row, 2] = A_OPT, o, START
    return (lay, category, per_mb, nbytes, host, alloc, free, per_unit, expensive[rec_tensor],
            kinds[rec_tensor])


@njit
def _state_rows(nbytes, alloc, u, r, layout, L, grad_bytes, grad_at, gathered, unsharded,
                host_bytes, weights, optimizer, bucket):
    """The bytes of the rows the units' model states decide, written into ``nbytes``, and
    the parameter gradients' allocation at the backward ``grad_at`` into ``alloc``, as one
    compiled pass (~25 numpy calls per new placement or shard move of a search): gathered
    parameters around each forward, backward and recomputation of the unit
    (:meth:`BlockTable.derive` keeps the last where it recomputes), its full gradient during
    its backward (until the reduce-scatter that ends it), its optimizer state on the host
    over the step (:func:`_fixed_rows` wrote their anchors). Returns the persistent bytes per
    layout and category, summed in unit order from 0 (as ``np.bincount`` sums: the same
    bits)."""
    persistent = np.zeros((L, len(CATEGORIES)))
    for i in range(len(layout)):
        g = u + NU * i + PARAM_GRAD
        nbytes[g] = grad_bytes[i]
        alloc[g, 0], alloc[g, 1], alloc[g, 2] = A_BWD, grad_at[i], END
        row = r + NM * i
        nbytes[row + GATHER_FWD] = gathered[i]
        nbytes[row + GATHER_BWD] = gathered[i]
        nbytes[row + GATHER_REC] = gathered[i]
        nbytes[row + UNSHARDED] = unsharded[i]
        nbytes[row + HOST_STATE] = host_bytes[i]
        persistent[layout[i], WEIGHTS] += weights[i]
        persistent[layout[i], OPTIMIZER] += optimizer[i]
        persistent[layout[i], COMMUNICATION] += bucket[i]
    return persistent


def host_on_device(rows: dict[str, np.ndarray], records: int) -> None:
    """``rows`` (a :meth:`BlockTable.derive` copy) for a step whose host memory is its
    device's own (a CPU), in place: host blocks are device blocks, and an offloaded storage's
    host image is what its backward reads. Export's offload hook copies a saved storage into
    a new image as its unit saves it, synchronously: the storage goes when its forward
    readers are done, not at the end of an offload task, and its image is there from the
    offload task's start (right after the unit's forward: a storage the unit made and read
    alone is handed over, one read on by later units is there twice until they are done).
    Backward restores it with ``Tensor.to`` on the device the image is already on, which
    returns the image itself: no restored copy is made, and the image goes when the
    restored copy would have (the start of its first saver's backward, as a kept storage
    goes)."""
    stored = np.flatnonzero(rows["host"][STORED:NS * records:NS]) * NS
    rows["free"][stored + PRODUCED, 1] = rows["free"][stored + PRODUCED, 0]
    rows["free"][stored + STORED] = rows["free"][stored + RESTORED]
    rows["bytes"][stored + RESTORED] = 0.0
    rows["host"][:] = False


class BlockTable:
    """Every block of one placement's plan, in fixed rows, re-derived by delta.

    Rows: four *slots* per record (the storage as produced, its compressed or offloaded
    copy, the copy restored before backward, the storage re-materialized by recomputation),
    then the gradient blocks of the placement, four per unit (forward, backward and
    recomputation temporaries, parameter gradients), the optimizer's temporaries, then the
    model-state blocks of the units, five per unit (:data:`STATE_SLOTS`). Rows
    that do not apply hold 0 bytes and are left out of the :class:`StepBlocks`.
    :meth:`derive` re-derives only the records whose rules read a unit whose policy, segment or
    compression ratio changed since the previous call. ``host_is_device``: the host's memory
    is the device's own (a CPU: :func:`host_on_device`).
    """

    def __init__(self, ga: GraphArrays, placed: Placed, layout: np.ndarray, degrees: np.ndarray,
                 microbatches: int, *, optimizer: str = "sgd", foreach: bool = True,
                 precision: str | None = None, shard: np.ndarray | None = None,
                 offload: np.ndarray | None = None, host_is_device: bool = False):
        n, M, P = ga.n, int(microbatches), placed
        R, G, L = len(P.tensor), len(P.grad_bytes), len(degrees)
        layout = np.asarray(layout, np.int64)
        n_opt = L if optimizer == "adam" else 0
        self.unit_row = NS * R + G
        self.state_row = self.unit_row + NU * n + n_opt
        self.placed, self.n, self.microbatches = P, n, M
        self.host_is_device = host_is_device
        self.saves, self.saved_by_kind, kinds = _saved(ga)
        # per unit, its bytes per part and micro-batch: recomputation temporaries, cached
        # outputs, backward temporaries (a tied weight's contributions are in bwd_tmp: the one
        # waiting for the others is a gradient alive between backwards, the sum the reader
        # that adds it in makes its own), and, for replan, unpacking temporaries (-1: unknown)
        # and what is unpacked before them; per record, expensive and its kind (each record's
        # ratio is its kind's)
        lay, category, per_mb, self.bytes, self.host, self.alloc, self.free, per_unit, \
            self.expensive, self.kind = _fixed_rows(
                P.layout, P.alloc, P.tensor, P.grad_layout, P.grad_bytes, P.grad_alloc,
                P.grad_free, layout, np.asarray(degrees, np.int64), M, n_opt, ga.fwd_tmp,
                ga.cached, ga.bwd_tmp, ga.unpack_tmp, ga.unpack_done, ga.expensive, kinds,
                *_unit_anchors(ga), *_unit_columns(n, n_opt))
        self.recompute_tmp, self.cached, self.bwd_tmp, self.unpack_tmp, self.unpack_done = per_unit
        self.static = {"layout": lay, "category": category, "per_mb": per_mb}
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
        layout = np.asarray(layout, np.int64)
        s, p, a = degrees[layout, 0], degrees[layout, 1], degrees[layout, 2]
        st = self.states = _unit_states(ga, s, p, a, shard, offload, precision, optimizer)
        # parameter gradients: their bytes follow the states, the backward they appear at the layout
        grad_bytes, grad_at = _parameter_gradients(ga, layout, st.gradients)
        # optimizer-step temporaries: Adam's sqrt(v) buffer, all at once (foreach) or per tensor
        if optimizer == "adam":
            p_train = ga.param_grad_bytes / p[ga.param_owner] * st.state_factor[ga.param_owner]
            p_lay = layout[ga.param_owner]
            self.bytes[u + NU * n:self.state_row] = [
                p_train[p_lay == lay].sum() if foreach else _per_tensor_adam(p_train[p_lay == lay])
                for lay in range(L)]
        self.persistent = _state_rows(self.bytes, self.alloc, u, self.state_row, layout, L,
                                      grad_bytes, grad_at, st.gathered, st.unsharded, st.host,
                                      st.weights, st.optimizer, st.bucket)

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

    def derive(self, policy: np.ndarray, segment: np.ndarray, ratio: np.ndarray) -> StepBlocks:
        """The blocks of ``policy`` (per unit), ``segment`` (recompute segment per unit) and
        ``ratio`` (compression ratio per unit and map kind, ``(units, kinds)``: a record is
        charged its carrier's ratio for its own kind, where the policy is compress)."""
        P = self.placed
        # the kernel works on mechanisms: policies sharing one share its memory rule
        pol = POLICIES.mechanism_codes[np.asarray(policy, np.int64)]
        segment = holding_segments(segment, self.saves)
        start = segment_starts(segment)
        ratio = np.asarray(ratio, np.float64)
        if ratio.ndim == 1:                   # one ratio for every kind
            ratio = np.repeat(ratio[:, None], len(MAP_KINDS), 1)
        ratio = np.ascontiguousarray(ratio)
        # the ratio of what each unit saves, its kinds weighted by their bytes
        held = self.saved_by_kind.sum(1)
        packed = (self.saved_by_kind / ratio).sum(1)
        unit_ratio = np.where(packed > 0, held / np.where(packed > 0, packed, 1.0), ratio[:, 0])
        old = self._key or (pol, start, ratio)
        offloaded, compressed = np.empty(self.n), np.empty(self.n)
        replan(pol, start, ratio, unit_ratio, *old, self._key is None, *P.touched, *P.savers,
               *P.members, *P.readers, P.prod, P.home, P.nbytes, P.kept_output, P.received,
               P.alloc, P.fwd_free, P.last_xfer, self.expensive, self.kind, self.n,
               self.unit_row, self.recompute_tmp, self.cached, self.bwd_tmp, self.unpack_tmp,
               self.unpack_done, self.bytes, self.host, self.alloc, self.free, self.carrier,
               self.compress, self._mark, offloaded, compressed)
        self._key = (pol, start, ratio)
        # gathered parameters for a recomputation: only where the unit is recomputed
        self.bytes[self.state_row + GATHER_REC:self.state_row + NM * self.n:NM] = np.where(
            start >= 0, self.states.gathered, 0.0)
        rows = {**self.static, "bytes": self.bytes.copy(), "host": self.host.copy(),
                "alloc": self.alloc.copy(), "free": self.free.copy()}
        if self.host_is_device:
            host_on_device(rows, len(P.tensor))
        return StepBlocks(rows, P.copies, offloaded, compressed, self.persistent, segment,
                          start, self.microbatches)

