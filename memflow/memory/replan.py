"""The policy rules of the memory model as one compiled pass over the records: which slots
of each record hold bytes, from which anchor to which, re-derived only for the records whose
rules read a unit whose policy, segment or ratio changed (delta re-planning)."""
from __future__ import annotations

import numpy as np

from ..strategy.policies import M_COMPRESSED, M_HOST, M_KEEP, M_RECOMPUTE, M_SELECTIVE
from .jit import njit
from .records import (A_BWD, A_COMPRESS, A_DECOMP, A_OFFLOAD, A_PREFETCH, A_RECOMP, END,
                      START)
from .slots import (BWD_TMP, CACHED, N_MECH, NONE, NS, NU, REC_TMP, REMAT, RESTORED, STORED,
                    _set)

__all__ = ["replan"]


@njit
def replan(pol, start, ratio, unit_ratio, old_pol, old_start, old_ratio, first, touched_ptr,
            touched, sv_ptr, sv, m_ptr, m, r_ptr, r, prod, home, nbytes, kept_output, received,
            rec_alloc, fwd_free, last_xfer, expensive, kind, n_units, unit_row, recompute_tmp,
            cached, bwd_tmp, unpack_tmp, unpack_done, bytes_, host, alloc, free, carrier,
            compress, mark, offloaded, compressed):
    """Re-derive the slots of the records whose rules read a unit whose policy, segment start
    or ratio changed (every record when ``first``); then the units' recomputation
    temporaries and the bytes each unit offloads and compresses. ``pol`` is per unit the
    *mechanism* of its policy (an index of :data:`MECHANISMS`), not the policy's code;
    ``ratio[u, k]`` the compression ratio of unit ``u`` on maps of kind ``k`` (``kind`` per
    record), ``unit_ratio[u]`` that of what ``u`` saves, its kinds weighted by bytes."""
    R = len(prod)
    far = np.iinfo(np.int64).max
    n_recs = 0
    if first:
        for x in range(R):
            mark[x] = True
        n_recs = R
    else:
        for u in range(n_units):
            changed = pol[u] != old_pol[u] or start[u] != old_start[u]
            for k in range(ratio.shape[1]):
                changed = changed or ratio[u, k] != old_ratio[u, k]
            if changed:
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
        keep = has[M_KEEP] or seg_in < far or sel or received[x]
        # a pipeline stage keeps what it received for its gradient: to its first member's backward
        got = m[m_ptr[x]] if received[x] and m_ptr[x + 1] > m_ptr[x] else far
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
            hold = min(first_saver if first_saver >= 0 else far, seg_in, p if sel else far, got)
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
        bytes_[row + STORED] = (b / ratio[cc, kind[x]] if state == M_COMPRESSED else b) if held \
            else 0.0
        host[row + STORED] = state == M_HOST
        alloc[row + STORED, 0], alloc[row + STORED, 1], alloc[row + STORED, 2] = go, cc, START
        # restored before backward; but a compressed one is decompressed node by node inside
        # its savers' backwards (their backward temporaries), its pack freed at the end of
        # them, where capture recorded how (``unpack_tmp`` not -1)
        by_node = state == M_COMPRESSED and unpack_tmp[cc] >= 0
        # ... and, where its last backward (its first saver's) decompresses node by node too,
        # each node frees its packs as it runs: that backward's temporaries hold what is left
        fs = max(first_saver, 0)
        gone = by_node and pol[fs] == M_COMPRESSED and unpack_tmp[fs] >= 0
        bytes_[row + RESTORED] = b if held and not by_node else 0.0
        alloc[row + RESTORED, 0], alloc[row + RESTORED, 1], alloc[row + RESTORED, 2] = back, cc, START
        for j in range(3):
            if by_node:
                _set(free, row + STORED, j, A_BWD, fs, START if gone else END)
            else:
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
    left = np.zeros(n_units)        # per unit, the packs its backward frees node by node
    for x in range(R):
        fs = sv[sv_ptr[x]] if sv_ptr[x + 1] > sv_ptr[x] else 0
        if carrier[x] >= 0 and compress[x] and pol[fs] == M_COMPRESSED and unpack_tmp[fs] >= 0 \
                and unpack_tmp[carrier[x]] >= 0:
            left[fs] += bytes_[NS * x + STORED]
    for u in range(n_units):
        bytes_[unit_row + NU * u + REC_TMP] = recompute_tmp[u] if start[u] >= 0 else 0.0
        bytes_[unit_row + NU * u + CACHED] = (cached[u] if start[u] >= 0
                                              and pol[u] == M_SELECTIVE else 0.0)
        # a compressing unit's backward decompresses what each node saved as the node runs,
        # and frees its packs as it goes: those left at its peak are temporaries of it
        by_node = pol[u] == M_COMPRESSED and unpack_tmp[u] >= 0
        bytes_[unit_row + NU * u + BWD_TMP] = (
            max(unpack_tmp[u] + left[u] - unpack_done[u] / unit_ratio[u], 0.0) if by_node
            else bwd_tmp[u])
        offloaded[u] = 0.0
        compressed[u] = 0.0
    for x in range(R):        # summed in record order, whatever changed
        if carrier[x] >= 0:
            if compress[x]:
                compressed[carrier[x]] += nbytes[x]
            else:
                offloaded[carrier[x]] += nbytes[x]
    return n_recs
