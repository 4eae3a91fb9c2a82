"""What the placements alone decide about activation storages: records, copies, gradients.

A *record* is one copy of a storage on one placement: the producer's placement (*home*) holds
the original, every other placement whose units read or save the storage gets a copy by a
transfer. Each record carries its size per part, the anchors of its allocation and of its
last forward read, and, as CSR rows, the units on its placement that use it (*members*), save
it and read it. The gradient blocks of storages and copies follow from the placements too.
Memory policies then decide what *holds* each record (:mod:`memflow.memory.blocks`).

Everything is computed for all storages at once over the (storage, user) pairs.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np

from .allocator import allocated_bytes
from .arrays import GraphArrays
from .jit import njit
from .regions import whole_blocks
from .rows import row_max, row_of

__all__ = ["Placed", "Copy", "Copies", "placements", "anchors", "ANCHORS", "ANCHOR_KINDS",
           "A_FWD", "A_BWD", "A_RECOMP", "A_OFFLOAD", "A_PREFETCH", "A_COMPRESS", "A_DECOMP",
           "A_XFER", "A_GXFER", "A_OPT", "START", "END"]

# the tasks whose start or end allocates or frees a block (see memflow.memory.blocks):
# "transfer" is a copy's transfer to its readers' placement, "gradient-transfer" its gradient's
# way back
ANCHORS = ("forward", "backward", "recompute", "offload", "prefetch", "compress", "decompress",
           "transfer", "gradient-transfer", "optimizer")
A_FWD, A_BWD, A_RECOMP, A_OFFLOAD, A_PREFETCH, A_COMPRESS, A_DECOMP, A_XFER, A_GXFER, \
    A_OPT = range(len(ANCHORS))
ANCHOR_KINDS = len(ANCHORS)
START, END = 0, 1


@dataclass(frozen=True)
class Copy:
    """A storage copied from its producer's placement to the placement of some readers."""

    tensor: int
    src_layout: int
    dst_layout: int
    bytes: float            # per part of the destination placement
    first_reader: int       # the transfer must land before this unit's forward
    last_reader: int        # the gradient goes back after this unit's backward
    grad: bool


@dataclass(frozen=True)
class Copies:
    """The copies between placements as arrays; indexing gives a :class:`Copy`."""

    tensor: np.ndarray
    src_layout: np.ndarray
    dst_layout: np.ndarray
    bytes: np.ndarray
    first_reader: np.ndarray
    last_reader: np.ndarray
    grad: np.ndarray

    def __len__(self) -> int:
        return len(self.tensor)

    def __getitem__(self, i: int) -> Copy:
        return Copy(int(self.tensor[i]), int(self.src_layout[i]), int(self.dst_layout[i]),
                    float(self.bytes[i]), int(self.first_reader[i]), int(self.last_reader[i]),
                    bool(self.grad[i]))

    def __iter__(self):
        return (self[i] for i in range(len(self)))


@dataclass(frozen=True)
class Placed:
    """Records, gradient blocks and copies of one placement of every unit."""

    tensor: np.ndarray        # per record: the storage
    layout: np.ndarray
    home: np.ndarray          # the producer's placement (else a copy)
    prod: np.ndarray          # producer unit, -1 for the model's inputs
    nbytes: np.ndarray        # per part
    alloc: np.ndarray         # (R, 3) anchor of the allocation
    fwd_free: np.ndarray      # (R, 3) end of the last forward read on this placement
    kept_output: np.ndarray   # a model output the step keeps until backward ends
    received: np.ndarray      # a copy a pipeline stage keeps for its gradient: on the device
    #                           until its first member's backward, whatever the policies
    last_xfer: np.ndarray     # (R, 3) end of the storage's last copy out (home), kind -1 if none
    members: tuple[np.ndarray, np.ndarray]   # CSR: users on this placement
    savers: tuple[np.ndarray, np.ndarray]    # CSR: savers on this placement (producer included)
    readers: tuple[np.ndarray, np.ndarray]   # CSR: forward readers on this placement
    touched: tuple[np.ndarray, np.ndarray]   # CSR per unit: records whose rules read its policy
    grad_layout: np.ndarray   # gradient blocks of storages and of copies
    grad_bytes: np.ndarray
    grad_alloc: np.ndarray    # (G, 3)
    grad_free: np.ndarray     # (G, 3)
    copies: Copies
    reads: tuple[np.ndarray, np.ndarray]     # CSR per unit: anchors (kind, key) its forward waits for
    grads_in: tuple[np.ndarray, np.ndarray]  # CSR per unit: anchors its backward waits for


def anchors(kind, key, edge) -> np.ndarray:
    """Anchors ``(kind, key, edge)`` stacked on a last axis, the three broadcast together.

    >>> anchors(A_BWD, np.array([4, 5]), END).tolist()
    [[1, 4, 1], [1, 5, 1]]
    """
    # filled column by column: stacking broadcast views was a quarter of a placement; the
    # shape is the key's when kind and edge are numbers (every call of a placement but one)
    if isinstance(key, np.ndarray) and np.isscalar(kind) and np.isscalar(edge):
        out = np.empty(key.shape + (3,), np.int64)
    else:
        out = np.empty(np.broadcast_shapes(*(np.shape(x) for x in (kind, key, edge))) + (3,),
                       np.int64)
    out[..., 0], out[..., 1], out[..., 2] = kind, key, edge
    return out


def _ptr(rows: np.ndarray, n_rows: int) -> np.ndarray:
    ptr = np.zeros(n_rows + 1, np.int64)
    np.cumsum(np.bincount(rows, minlength=n_rows), out=ptr[1:])
    return ptr


@njit
def _anchor_rows(unit: np.ndarray, kind: np.ndarray, key: np.ndarray, n: int,
                 n_keys: int) -> tuple[np.ndarray, np.ndarray]:
    """Per unit, the distinct anchors ``(kind, key)`` in sorted order, as CSR (idx is (k, 2))."""
    code = np.unique((unit * ANCHOR_KINDS + kind) * n_keys + key)
    ptr = np.zeros(n + 1, np.int64)
    idx = np.empty((len(code), 2), np.int64)
    for j in range(len(code)):
        u, rest = divmod(code[j], ANCHOR_KINDS * n_keys)
        ptr[u + 1] += 1
        idx[j, 0], idx[j, 1] = divmod(rest, n_keys)
    for u in range(n):
        ptr[u + 1] += ptr[u]
    return ptr, idx


@njit
def _records(t_ptr, pv, layout, home_t):
    """The records: per storage (ascending), its (storage, placement) groups of users, the
    home placement's first (a record with no member, ``min`` -1, where no user is at home),
    then the others by their first member. Returns per record ``(storage, placement, first
    member, home?)``, the pairs in record order (users ascending within a record, an index
    into the pairs) and each one's record. One pass over the pairs, sorted by (storage,
    user): a search re-places the same graph many times, and sorting the group codes of
    tiny arrays was a quarter of a placement."""
    n_t, P = len(t_ptr) - 1, len(pv)
    rec_t = np.empty(P + n_t, np.int64)
    rec_lay = np.empty(P + n_t, np.int64)
    rec_min = np.empty(P + n_t, np.int64)
    rec_home = np.empty(P + n_t, np.bool_)
    order = np.empty(P, np.int64)
    pair_rec = np.empty(P, np.int64)
    slot = np.full(int(layout.max()) + 1, -1, np.int64)    # layout -> its group, this storage
    firsts = np.empty(max(P, 1), np.int64)          # each group's first pair, in order found
    R = 0
    k = 0
    for t in range(n_t):
        h = home_t[t]
        if h < 0:
            continue
        a, b = t_ptr[t], t_ptr[t + 1]
        groups = 0
        for j in range(a, b):
            lay = layout[pv[j]]
            if slot[lay] < 0:
                slot[lay] = groups
                firsts[groups] = j
                groups += 1
        home_group = slot[h]
        # the home record first, then the others by first member (the order groups were found)
        for g in range(-1, groups):
            if g == -1:
                lay = h
                first = firsts[home_group] if home_group >= 0 else -1
            else:
                if g == home_group:
                    continue
                lay = layout[pv[firsts[g]]]
                first = firsts[g]
            rec_t[R], rec_lay[R], rec_home[R] = t, lay, g == -1
            rec_min[R] = pv[first] if first >= 0 else -1
            if first >= 0:
                for j in range(first, b):
                    if layout[pv[j]] == lay:
                        order[k] = j
                        pair_rec[k] = R
                        k += 1
            R += 1
        for j in range(a, b):
            slot[layout[pv[j]]] = -1
    return rec_t[:R], rec_lay[:R], rec_min[:R], rec_home[:R], order, pair_rec


_PAIRS: dict[int, tuple] = {}


def _pairs(ga: GraphArrays) -> tuple[np.ndarray, ...]:
    """The (storage, user) pairs of ``ga``, sorted (the users are the readers and savers but
    the producer), made once per graph: a search re-places the same graph many times."""
    hit = _PAIRS.get(id(ga))
    if hit is not None and hit[0]() is ga:
        return hit[1]
    n, n_t = ga.n, len(ga.bytes)
    r_t = row_of(ga.readers_ptr)
    s_t = row_of(ga.savers_ptr)
    own = ga.savers_idx == ga.producer[s_t]
    r_code = r_t * n + ga.readers_idx
    s_code = s_t[~own] * n + ga.savers_idx[~own]
    code = np.union1d(r_code, s_code)
    pt, pv = np.divmod(code, n)
    out = (s_t, own, pt, pv, np.isin(code, r_code, assume_unique=True),
           np.isin(code, s_code, assume_unique=True), _ptr(pt, n_t))
    for x in out:
        x.flags.writeable = False
    if len(_PAIRS) > 16:        # graphs long gone
        _PAIRS.clear()
    _PAIRS[id(ga)] = (weakref.ref(ga), out)
    return out


def placements(ga: GraphArrays, layout: np.ndarray, sa: np.ndarray, p: np.ndarray,
               microbatches: int, allocator: str | None = None,
               sequence: np.ndarray | None = None, stage: np.ndarray | None = None) -> Placed:
    """The records, copies and gradient blocks of ``layout`` (placement per unit), where
    ``sa`` is each unit's sample × attribute degree and ``p`` its parameter degree.
    ``allocator="cuda"`` charges each record the CUDA caching allocator's block
    (:func:`memflow.memory.allocator.allocated_bytes`) instead of its bytes.

    A tensor internal to a split unit (or to its block, :mod:`.regions`, when the block runs
    whole on one placement: tensor parallelism splits its units alike) is held at ``1/p`` per
    part, but for its residual-stream tensors (``ga.stream``: Megatron's replicated LayerNorm and dropout tensors), unless the
    unit is ``sequence`` parallel (per unit, bool); under sequence parallelism a stream tensor
    passed between sequence-parallel units only, or copied into them (scattered), is held at
    ``1/p`` too (Korthikanti et al.
    2022: ``sbh(10 + 24/t + 5as/(ht))`` per block, ``sbh(34 + 5as/h)/t`` with sequence
    parallelism).

    A pipeline stage (``stage``, per unit) keeps a storage it receives from another stage
    with a gradient to compute until its backward, saved or not: ``PipelineStage`` computes
    the gradients of its inputs, so autograd holds the received leaf (a bf16 Llama's hidden
    state, which RMSNorm saves only as its fp32 copy): on the device until the backward of
    its first member there, whatever their policies (``received``)."""
    n, last, M = ga.n, ga.n - 1, int(microbatches)
    n_t = len(ga.bytes)
    prod_t = ga.producer
    s_t, own, pt, pv, p_read, p_save, t_ptr = _pairs(ga)
    has_users = np.diff(t_ptr) > 0
    first_user = np.where(has_users, pv[np.minimum(t_ptr[:-1], max(len(pv) - 1, 0))]
                          if len(pv) else 0, -1)
    home_t = np.where(prod_t >= 0, layout[np.maximum(prod_t, 0)],
                      np.where(has_users, layout[np.maximum(first_user, 0)], -1))

    rec_t, rec_lay, rec_min, rec_home, by_rec, pair_rec = _records(t_ptr, pv, layout, home_t)
    R = len(rec_t)
    # pairs in record order (users ascending within a record)
    pv, p_read, p_save = pv[by_rec], p_read[by_rec], p_save[by_rec]
    members = (_ptr(pair_rec, R), pv)
    readers = (_ptr(pair_rec[p_read], R), pv[p_read])
    rec_prod = prod_t[rec_t]
    # the producer saves it: first of the home record's savers (it runs before every user)
    prod_saves = np.zeros(n_t, bool)
    prod_saves[s_t[own]] = True
    lead = rec_home & prod_saves[rec_t]
    sv_rec = np.concatenate([np.flatnonzero(lead), pair_rec[p_save]])
    sv_unit = np.concatenate([rec_prod[lead], pv[p_save]])
    sv_order = np.lexsort((sv_unit, sv_rec))
    savers = (_ptr(sv_rec, R), sv_unit[sv_order])

    # sizes per part
    per_sample = ga.per_sample[rec_t]
    size = ga.bytes[rec_t] / np.where(per_sample, M, 1)
    lead_unit = np.where(rec_home & (rec_prod >= 0), rec_prod, rec_min)
    share = np.where(per_sample, 1.0 / sa[np.maximum(lead_unit, 0)], 1.0)
    # read only inside its producer's block if the block runs whole on one placement
    # (.regions), else by no other unit
    internal = np.where(whole_blocks(ga.block, layout, p > 1)[np.maximum(rec_prod, 0)],
                        ga.internal[rec_t], (ga.readers_ptr[rec_t + 1] == ga.readers_ptr[rec_t])
                        & ~ga.is_output[rec_t])
    prod = np.maximum(rec_prod, 0)
    seq = np.zeros(n, bool) if sequence is None else sequence & (p > 1)
    stream = ga.stream[rec_t]
    split = rec_home & (rec_prod >= 0) & (p[prod] > 1) & (
        internal & (~stream | seq[prod])           # internal to a split unit (block)
        | (seq[prod] & stream & ~ga.is_output[rec_t]
           & (np.bincount(pair_rec, ~seq[pv], minlength=R) == 0)))  # sequence-split stream
    share = np.where(split, share / p[prod], share)
    moved = allocated_bytes(size * share, allocator)
    # a stream tensor entering a run of sequence-parallel units is scattered there (each
    # part keeps its share of the sequence, the whole is freed): a copy from another
    # placement, or one made on the run's own placement by an unsplit unit (glue a
    # tensor-parallel group runs on every rank, memflow.sim.replication.as_run) that does not
    # save it itself
    entry = stream & (rec_min >= 0) & seq[np.maximum(rec_min, 0)] & (
        np.bincount(pair_rec, ~seq[pv], minlength=R) == 0) & (
        ~rec_home | ((rec_prod < 0) | ~seq[prod]) & ~lead)
    nbytes = np.where(entry, allocated_bytes(size * share / p[np.maximum(rec_min, 0)],
                                             allocator), moved)

    # copies: every record off the producer's placement
    is_copy = ~rec_home
    copy_id = np.where(is_copy, np.cumsum(is_copy) - 1, -1)
    r_max = row_max(readers[0], readers[1], -1)
    m_max = row_max(members[0], members[1], -1)
    rg = ga.requires_grad[rec_t]
    received = np.zeros(R, bool)
    if stage is not None:       # ... from another stage, with a gradient to compute
        from_unit = np.where(rec_prod >= 0, rec_prod, np.maximum(first_user[rec_t], 0))
        received = is_copy & rg & (rec_min >= 0) & (
            stage[np.maximum(rec_min, 0)] != stage[from_unit])
    cp = np.flatnonzero(is_copy)
    copies = Copies(tensor=rec_t[cp], src_layout=home_t[rec_t[cp]], dst_layout=rec_lay[cp],
                    bytes=moved[cp], first_reader=rec_min[cp], last_reader=m_max[cp],
                    grad=rg[cp] & (r_max[cp] >= 0))
    alloc = np.where(rec_home[:, None], anchors(A_FWD, np.where(rec_prod >= 0, rec_prod, rec_min),
                                                START), anchors(A_XFER, copy_id, START))
    fwd_last = np.where(r_max >= 0, r_max, np.where(rec_home & (rec_prod >= 0), rec_prod, rec_min))
    model_out = rec_home & ga.is_output[rec_t]
    last_copy = np.full(n_t, -1)
    np.maximum.at(last_copy, rec_t[cp], copy_id[cp])
    lx = np.where(rec_home, last_copy[rec_t], -1)
    last_xfer = np.where((lx >= 0)[:, None], anchors(A_XFER, lx, END), -1)

    # gradients: of each copy a reader needs, and of the storage itself
    src_grad = rg & ((r_max >= 0) | model_out)
    g_copy = cp[src_grad[cp]]
    src_pos = np.where(rec_home, np.where(model_out, n, r_max), rec_min)
    src_anchor = np.where(
        rec_home[:, None],
        anchors(A_BWD, np.where(model_out, last, r_max), END),
        anchors(A_GXFER, copy_id, START))
    with_src = np.flatnonzero(src_grad)
    best = np.full(n_t, -1)
    np.maximum.at(best, rec_t[with_src], src_pos[with_src])
    # the latest source (the first backward to run) allocates the storage's gradient
    winner = with_src[src_pos[with_src] == best[rec_t[with_src]]]
    g_t = rec_t[winner]
    first_any = np.where(prod_t >= 0, prod_t, first_user)
    t_share = np.where(ga.per_sample, 1.0 / sa[np.maximum(first_any, 0)], 1.0)
    grad_layout = np.concatenate([rec_lay[g_copy], home_t[g_t]])
    grad_bytes = np.concatenate([nbytes[g_copy],
                                 ga.bytes[g_t] / np.where(ga.per_sample[g_t], M, 1) * t_share[g_t]])
    grad_alloc = np.concatenate([anchors(A_BWD, r_max[g_copy], END), src_anchor[winner]])
    grad_free = np.concatenate([anchors(A_GXFER, copy_id[g_copy], END),
                                anchors(A_BWD, first_any[g_t], START)])
    keep = grad_bytes > 0

    # per unit, the anchors its forward reads and its backward's incoming gradients
    m_rec = row_of(members[0])
    n_keys = max(n, len(cp), 1)
    via_copy = is_copy[m_rec]
    direct = ~via_copy & (rec_prod[m_rec] >= 0)
    reads = _anchor_rows(
        np.concatenate([members[1][via_copy], members[1][direct]]),
        np.concatenate([np.full(int(via_copy.sum()), A_XFER), np.full(int(direct.sum()), A_FWD)]),
        np.concatenate([copy_id[m_rec[via_copy]], rec_prod[m_rec[direct]]]), n, n_keys)
    r_rec = row_of(readers[0])
    to = rec_prod[r_rec] >= 0
    r_rec, r_unit = r_rec[to], readers[1][to]
    back = is_copy[r_rec] & rg[r_rec]
    outs = np.flatnonzero(ga.is_output & (prod_t >= 0) & (prod_t != last))
    grads_in = _anchor_rows(
        np.concatenate([rec_prod[r_rec], prod_t[outs]]),
        np.concatenate([np.where(back, A_GXFER, A_BWD), np.full(len(outs), A_FWD)]),
        np.concatenate([np.where(back, copy_id[r_rec], r_unit), np.full(len(outs), last)]),
        n, n_keys)

    # which records read the policy or segment of a unit: their members and producer
    t_rec = np.concatenate([m_rec, np.flatnonzero(rec_home & (rec_prod >= 0))])
    t_unit = np.concatenate([members[1], rec_prod[rec_home & (rec_prod >= 0)]])
    t_order = np.lexsort((t_rec, t_unit))
    touched = (_ptr(t_unit, n), t_rec[t_order])
    return Placed(tensor=rec_t, layout=rec_lay, home=rec_home, prod=rec_prod, nbytes=nbytes,
                  alloc=alloc, fwd_free=anchors(A_FWD, fwd_last, END),
                  kept_output=model_out & ga.keep_output, received=received,
                  last_xfer=last_xfer, members=members, savers=savers, readers=readers,
                  touched=touched, grad_layout=grad_layout[keep], grad_bytes=grad_bytes[keep],
                  grad_alloc=grad_alloc[keep], grad_free=grad_free[keep], copies=copies,
                  reads=reads, grads_in=grads_in)

