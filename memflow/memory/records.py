"""What the placements alone decide about activation storages: records, copies, gradients.

A *record* is one copy of a storage on one placement: the producer's placement (*home*) holds
the original, every other placement whose units read or save the storage gets a copy by a
transfer. Each record carries its size per part, the anchors of its allocation and of its
last forward read, and, as CSR rows, the units on its placement that use it (*members*), save
it and read it. The gradient blocks of storages and copies follow from the placements too.
Memory policies then decide what *holds* each record (:mod:`memflow.memory.blocks`).

Everything is computed for all storages at once, in one compiled pass over the (storage,
user) pairs (:mod:`.record_pass`).
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np

from .allocator import block_of
from .anchors import (A_BWD, A_COMPRESS, A_DECOMP, A_FWD, A_GXFER, A_OFFLOAD, A_OPT,
                      A_PREFETCH, A_RECOMP, A_XFER, ANCHOR_KINDS, ANCHORS, END, START)
from .arrays import GraphArrays
from .record_pass import placed_arrays
from .rows import row_of

__all__ = ["Placed", "Copy", "Copies", "placements", "ANCHORS", "ANCHOR_KINDS",
           "A_FWD", "A_BWD", "A_RECOMP", "A_OFFLOAD", "A_PREFETCH", "A_COMPRESS", "A_DECOMP",
           "A_XFER", "A_GXFER", "A_OPT", "START", "END"]

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


def _ptr(rows: np.ndarray, n_rows: int) -> np.ndarray:
    ptr = np.zeros(n_rows + 1, np.int64)
    np.cumsum(np.bincount(rows, minlength=n_rows), out=ptr[1:])
    return ptr


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
    out = (s_t, own, pv, np.isin(code, r_code, assume_unique=True),
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
    (:func:`memflow.memory.allocator.charged`) instead of its bytes.

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
    s_t, own, pv, p_read, p_save, t_ptr = _pairs(ga)
    rec_t, rec_lay, rec_home, rec_prod, nbytes, alloc, fwd_free, kept, received, last_xfer, \
        members, savers, readers, touched, grad, copies, reads, grads_in = placed_arrays(
            ga.n, ga.bytes, ga.per_sample, ga.producer, ga.internal, ga.readers_ptr,
            ga.is_output, ga.stream, ga.requires_grad, ga.block, s_t, own, pv, p_read,
            p_save, t_ptr, np.asarray(layout, np.int64), np.asarray(sa, np.float64),
            np.asarray(p, np.int64), int(microbatches),
            np.zeros(ga.n, bool) if sequence is None else np.asarray(sequence, bool),
            stage is not None, np.asarray(np.zeros(0) if stage is None else stage, np.int64),
            block_of(allocator), ga.keep_output)
    return Placed(tensor=rec_t, layout=rec_lay, home=rec_home, prod=rec_prod, nbytes=nbytes,
                  alloc=alloc, fwd_free=fwd_free, kept_output=kept,
                  received=received, last_xfer=last_xfer, members=members, savers=savers,
                  readers=readers, touched=touched, grad_layout=grad[0], grad_bytes=grad[1],
                  grad_alloc=grad[2], grad_free=grad[3], copies=Copies(*copies), reads=reads,
                  grads_in=grads_in)

