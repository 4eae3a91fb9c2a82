"""The block table of one placement: every block of its plan in fixed rows, the rows the
placement and the model states fix made once, the policy-dependent ones re-derived by delta
(:func:`memflow.memory.replan.replan`)."""
from __future__ import annotations

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
                    RESTORED, STATE_SLOTS, STORED, TRANSIENT, UNSHARDED, WEIGHTS, _set)
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



@njit
def _gradient_pass(owner, unit, nbytes, layout, gradients):
    """Per unit, the parameter-gradient bytes its backward makes and the unit at whose
    backward's end they exist, over the parameters ``owner``, ``unit`` (the last reader) and
    ``nbytes`` (:class:`GraphArrays`' ``param_owner``, ``param_grad_unit``,
    ``param_grad_bytes``). A parameter's gradient appears with the backward of its last
    reader (the first to run), on its owner's placement: ``gradients`` (per owner) is shared
    out over its parameters by their bytes and charged to that reader when the reader is on the
    owner's placement, else to the owner at the earliest such backward of its parameters.
    One compiled pass (as numpy expressions, ~15 calls per new placement of a search): the
    owners' totals and the shares are summed in parameter order, as ``np.bincount`` and
    ``np.add.at`` sum them (the same bits).

    >>> [x.tolist() for x in _gradient_pass(np.array([0]), np.array([0]), np.array([400.0]),
    ...                                     np.zeros(2, np.int64), np.array([400.0, 0.0]))]
    [[400.0, 0.0], [0, 1]]
    """
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


# per unit slot and per model-state slot, the category and the per-micro-batch flag of its row
# (parameter gradients: one per step; the unit's other blocks per micro-batch)
_UNIT_CATEGORY = tuple(GRADIENTS if j == PARAM_GRAD else ACTIVATIONS if j == CACHED
                       else TRANSIENT for j in range(NU))
_UNIT_PER_MB = tuple(FIRST_MB if j == PARAM_GRAD else EVERY_MB for j in range(NU))
_STATE_CATEGORY = tuple(c for c, _ in STATE_SLOTS.values())
_STATE_PER_MB = tuple(m for _, m in STATE_SLOTS.values())
# the rows of a unit ``i`` held within its own tasks: ``(slot, kind, edge, until)``, allocated
# at ``(kind, i, edge)`` and freed at the end of ``(until, i)``: its forward, backward and
# recomputation temporaries, its cached outputs (from its forward to its recomputation); its
# parameters gathered around its forward, backward and recomputation, its full gradient in
# its backward
_UNIT_ANCHORS = ((FWD_TMP, A_FWD, START, A_FWD), (BWD_TMP, A_BWD, START, A_BWD),
                 (REC_TMP, A_RECOMP, START, A_RECOMP), (CACHED, A_FWD, END, A_RECOMP))
_STATE_ANCHORS = ((GATHER_FWD, A_FWD, START, A_FWD), (GATHER_BWD, A_BWD, START, A_BWD),
                  (GATHER_REC, A_RECOMP, START, A_RECOMP), (UNSHARDED, A_BWD, START, A_BWD))


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


def _unit_states(ga: GraphArrays, unit_degrees: np.ndarray, shard, offload,
                 precision: str | None, optimizer: str):
    """:func:`~memflow.memory.states.unit_states` of the units' degrees ``unit_degrees``
    (``(units, 3)``: sample, parameter, attribute), kept per those degrees and model states:
    a search's swap and copy moves re-place units on other devices with the same degrees,
    and the states read no device. The shard levels' bytes are those of their own dtype (a
    Strategy's int8: no conversion), each a code of a few values, so equal bytes of one length
    are equal levels."""
    key = (id(ga), unit_degrees.tobytes(), None if shard is None else np.asarray(shard).tobytes(),
           None if offload is None else np.asarray(offload, bool).tobytes(), precision, optimizer)
    hit = _STATES.get(key)
    if hit is not None and hit[0]() is ga:
        return hit[1]
    s, p, a = np.ascontiguousarray(unit_degrees.T)
    st = unit_states(ga, s, p, a, shard, offload, precision, optimizer)
    if len(_STATES) > 256:        # degrees seen long ago
        _STATES.clear()
    _STATES[key] = (weakref.ref(ga), st)
    return st


@njit
def _anchored(alloc, free, row, kind, key, edge, until, until_key):
    """Row ``row`` allocated at ``(kind, key, edge)`` and freed at the end of ``(until,
    until_key)``."""
    alloc[row, 0], alloc[row, 1], alloc[row, 2] = kind, key, edge
    for e in range(3):
        _set(free, row, e, until, until_key, END)


@njit
def _columns(static, row, layout, category, per_mb):
    """The static columns of the rows from ``row`` on, one per slot of ``category`` and
    ``per_mb`` (:data:`_UNIT_CATEGORY`...), all of layout ``layout``."""
    for j in range(len(category)):
        static[0, row + j], static[1, row + j], static[2, row + j] = layout, category[j], per_mb[j]


@njit
def _fixed_rows(rec_layout, rec_alloc, rec_tensor, grad_layout, grad_bytes, grad_alloc,
                grad_free, layout, degrees, microbatches, n_opt, fwd_tmp, cached, bwd_tmp,
                unpack_tmp, unpack_done, expensive, kinds):
    """The rows no policy and no model state decides (:class:`BlockTable`), as one compiled
    pass, each element written once and none read but the records' and gradients' own (as
    numpy expressions these were ~60 calls per new placement of a search, as row slices
    thousands of small copies into zeroed arrays, and copied from per-graph templates a
    third slower than written). The records' slots are left to :func:`replan`, whose first
    pass writes every one (their anchors but the produced storage's allocation, their bytes),
    and the parameter gradients' allocation to :func:`_state_rows`. Returns the static
    ``layout``, ``category`` and ``per_mb`` columns as the rows of one array; ``bytes``,
    ``host``, ``alloc``, ``free`` with the gradients', units' and model states' fixed rows
    written (the policy's slots 0 until :func:`replan`; the states' bytes are
    :func:`_state_rows`'); per unit, the rows of its recomputation, cached-output, backward
    and unpacking bytes per part and micro-batch (:class:`BlockTable`'s ``recompute_tmp``,
    ``cached``, ``bwd_tmp``, ``unpack_tmp``, ``unpack_done``); per record, whether an
    expensive op made it, and its map kind."""
    R, G, n = len(rec_layout), len(grad_layout), len(layout)
    u = NS * R + G
    state_row = u + NU * n + n_opt
    k = state_row + NM * n
    static = np.empty((3, k), np.int64)      # layout, category, per_mb
    nbytes = np.zeros(k)
    host = np.zeros(k, np.bool_)
    alloc = np.empty((k, 3), np.int64)
    free = np.empty((k, 3, 3), np.int64)
    per_unit = np.empty((5, n))
    for r in range(R):
        for j in range(NS):
            row = NS * r + j
            static[0, row], static[1, row], static[2, row] = rec_layout[r], ACTIVATIONS, EVERY_MB
        for c in range(3):
            alloc[NS * r + PRODUCED, c] = rec_alloc[r, c]
    for g in range(G):
        row = NS * R + g
        static[0, row], static[1, row], static[2, row] = grad_layout[g], TRANSIENT, EVERY_MB
        nbytes[row] = grad_bytes[g]
        for c in range(3):
            alloc[row, c] = grad_alloc[g, c]
            for e in range(3):
                free[row, e, c] = grad_free[g, c]
    for i in range(n):
        d = layout[i]
        per = 1.0 / (degrees[d, 0] * degrees[d, 1] * degrees[d, 2]) / microbatches
        per_unit[0, i] = fwd_tmp[i] * per
        per_unit[1, i] = cached[i] * per
        per_unit[2, i] = bwd_tmp[i] * per
        per_unit[3, i] = -1.0 if unpack_tmp[i] < 0 else unpack_tmp[i] * per
        per_unit[4, i] = unpack_done[i] * per
        row = u + NU * i
        _columns(static, row, d, _UNIT_CATEGORY, _UNIT_PER_MB)
        for slot, kind, edge, until in _UNIT_ANCHORS:
            _anchored(alloc, free, row + slot, kind, i, edge, until, i)
        for e in range(3):         # parameter gradients: to the optimizer step of the layout
            _set(free, row + PARAM_GRAD, e, A_OPT, d, END)
        nbytes[row + FWD_TMP] = per_unit[0, i]
        nbytes[row + BWD_TMP] = per_unit[2, i]
        # the model-state rows (their bytes are the states'); the host state from the forward
        # to the optimizer step of the unit's layout
        row = state_row + NM * i
        _columns(static, row, d, _STATE_CATEGORY, _STATE_PER_MB)
        for slot, kind, edge, until in _STATE_ANCHORS:
            _anchored(alloc, free, row + slot, kind, i, edge, until, i)
        _anchored(alloc, free, row + HOST_STATE, A_FWD, i, START, A_OPT, d)
        host[row + HOST_STATE] = True
    for o in range(n_opt):         # the optimizer's temporaries: in its step on each layout
        row = u + NU * n + o
        static[0, row], static[1, row], static[2, row] = o, TRANSIENT, FIRST_MB
        _anchored(alloc, free, row, A_OPT, o, START, A_OPT, o)
    return static, nbytes, host, alloc, free, per_unit, expensive[rec_tensor], kinds[rec_tensor]


@njit
def _state_rows(nbytes, alloc, u, r, layout, L, owner, param_unit, param_bytes, gradients,
                gathered, unsharded, host_bytes, weights, optimizer, bucket):
    """The bytes of the rows the units' model states decide, written into ``nbytes``, and
    the parameter gradients' allocation at their backward (:func:`_gradient_pass` of the
    parameters ``owner``, ``param_unit``, ``param_bytes``) into ``alloc``, as one compiled
    pass (~25 numpy calls per new placement or shard move of a search): gathered parameters
    around each forward, backward and recomputation of the unit (:meth:`BlockTable.derive`
    keeps the last where it recomputes), its full gradient during its backward (until the
    reduce-scatter that ends it), its optimizer state on the host over the step
    (:func:`_fixed_rows` wrote their anchors). Returns the persistent bytes per layout and
    category, summed in unit order from 0 (as ``np.bincount`` sums: the same bits)."""
    grad_bytes, grad_at = _gradient_pass(owner, param_unit, param_bytes, layout, gradients)
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
        layout, degrees = np.asarray(layout, np.int64), np.asarray(degrees, np.int64)
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
        static, self.bytes, self.host, self.alloc, self.free, per_unit, self.expensive, \
            self.kind = _fixed_rows(
                P.layout, P.alloc, P.tensor, P.grad_layout, P.grad_bytes, P.grad_alloc,
                P.grad_free, layout, degrees, M, n_opt, ga.fwd_tmp, ga.cached, ga.bwd_tmp,
                ga.unpack_tmp, ga.unpack_done, ga.expensive, kinds)
        self.recompute_tmp, self.cached, self.bwd_tmp, self.unpack_tmp, self.unpack_done = per_unit
        self.static = {"layout": static[0], "category": static[1], "per_mb": static[2]}
        # per record: the unit whose task offloads/compresses it, whether it is compressed;
        # replan's first pass writes every record's (derive's first call is by no delta)
        self.carrier = np.empty(R, np.int64)
        self.compress = np.empty(R, bool)
        self._mark = np.zeros(R, bool)
        self._key: tuple[np.ndarray, ...] | None = None
        self._set_states(ga, layout, degrees, optimizer, foreach, precision, shard, offload)

    def _set_states(self, ga: GraphArrays, layout: np.ndarray, degrees: np.ndarray,
                    optimizer: str, foreach: bool, precision: str | None,
                    shard: np.ndarray | None, offload: np.ndarray | None) -> None:
        """The rows and persistent bytes the units' model states decide (parameter gradients,
        the optimizer's temporaries, the model-state rows); no record's rows read them."""
        u, L = self.unit_row, len(degrees)
        layout = np.asarray(layout, np.int64)
        unit_degrees = np.asarray(degrees, np.int64).take(layout, 0)  # degrees[layout]: 4x slower
        st = self.states = _unit_states(ga, unit_degrees, shard, offload, precision, optimizer)
        # optimizer-step temporaries: Adam's sqrt(v) buffer, all at once (foreach) or per tensor
        if optimizer == "adam":
            p = unit_degrees[:, 1]
            p_train = ga.param_grad_bytes / p[ga.param_owner] * st.state_factor[ga.param_owner]
            p_lay = layout[ga.param_owner]
            self.bytes[u + NU * self.n:self.state_row] = [
                p_train[p_lay == lay].sum() if foreach else _per_tensor_adam(p_train[p_lay == lay])
                for lay in range(L)]
        # parameter gradients: their bytes follow the states, the backward they appear at the
        # layout
        self.persistent = _state_rows(
            self.bytes, self.alloc, u, self.state_row, layout, L, ga.param_owner,
            ga.param_grad_unit, ga.param_grad_bytes, st.gradients, st.gathered, st.unsharded,
            st.host, st.weights, st.optimizer, st.bucket)

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

