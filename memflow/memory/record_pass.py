"""The records of one placement, as one compiled pass over the (storage, user) pairs.

A search re-places the same graph for a good share of its proposals: as numpy expressions the
records were ~150 calls on arrays of a few hundred records each, the costliest stage of a new
placement. The loops here make each value by the same operations in the same order as those
expressions did (so the same bits), and run interpreted without numba
(:mod:`memflow.memory.jit`).
"""
from __future__ import annotations

import numpy as np

from .allocator import charged
from .anchors import A_BWD, A_FWD, A_GXFER, A_XFER, ANCHOR_KINDS, END, START
from .jit import njit

__all__ = ["placed_arrays"]


# a unit reads a handful of anchors: insertion sort on its own below this many, else np.sort
_SMALL = 32


@njit
def _anchor_rows(unit: np.ndarray, kind: np.ndarray, key: np.ndarray, n: int,
                 n_keys: int) -> tuple[np.ndarray, np.ndarray]:
    """Per unit, the distinct anchors ``(kind, key)`` in sorted order, as CSR (idx is (k, 2)).
    Bucketed by unit, then each unit's few codes sorted: sorting all the codes at once
    (``np.unique``) was a third of the pass."""
    m = len(unit)
    start = np.zeros(n + 1, np.int64)
    for j in range(m):
        start[unit[j] + 1] += 1
    for u in range(n):
        start[u + 1] += start[u]
    code = np.empty(m, np.int64)
    fill = start[:-1].copy()
    for j in range(m):
        code[fill[unit[j]]] = kind[j] * n_keys + key[j]
        fill[unit[j]] += 1
    ptr = np.zeros(n + 1, np.int64)
    idx = np.empty((m, 2), np.int64)
    w = 0
    for u in range(n):
        a, b = start[u], start[u + 1]
        if b - a > _SMALL:
            code[a:b] = np.sort(code[a:b])
        else:
            for i in range(a + 1, b):
                c = code[i]
                j = i - 1
                while j >= a and code[j] > c:
                    code[j + 1] = code[j]
                    j -= 1
                code[j + 1] = c
        for i in range(a, b):
            if i == a or code[i] != code[i - 1]:
                idx[w, 0], idx[w, 1] = divmod(code[i], n_keys)
                w += 1
        ptr[u + 1] = w
    return ptr, idx[:w].copy()


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


@njit
def _fill(out, row, kind, key, edge):
    out[row, 0], out[row, 1], out[row, 2] = kind, key, edge


@njit
def placed_arrays(n, t_bytes, t_per_sample, prod_t, t_internal, readers_ptr, is_output, t_stream,
            requires_grad, block, s_t, own, pv, p_read, p_save, t_ptr, layout, sa, p, M,
            sequence, staged, stage, alloc_block, keep_output):
    """The records of a placement (:func:`~memflow.memory.records.placements` after the
    pairs), as one compiled pass: the numpy expressions it
    replaced were ~150 calls on arrays of a few hundred records, the costliest stage of a new
    placement in a search; each value is made by the same operations in the same order (so
    the same bits). Returns the fields of :class:`Placed` (CSR pairs as tuples, the gradient
    blocks' four arrays and the copies' seven as tuples)."""
    last, n_t = n - 1, len(t_bytes)
    first_user = np.full(n_t, -1, np.int64)
    home_t = np.full(n_t, -1, np.int64)
    for t in range(n_t):
        if t_ptr[t + 1] > t_ptr[t]:
            first_user[t] = pv[t_ptr[t]]
        if prod_t[t] >= 0:
            home_t[t] = layout[prod_t[t]]
        elif first_user[t] >= 0:
            home_t[t] = layout[first_user[t]]
    rec_t, rec_lay, rec_min, rec_home, by_rec, pair_rec = _records(t_ptr, pv, layout, home_t)
    R, P = len(rec_t), len(by_rec)
    # pairs in record order (users ascending within a record)
    uv, u_read, u_save = pv[by_rec], p_read[by_rec], p_save[by_rec]
    rec_prod = prod_t[rec_t]
    seq = sequence & (p > 1)
    # whole_blocks (.regions) with the parameter split: per block, the least and greatest key
    key = 2 * layout + (p > 1)
    lo = np.full(n, np.iinfo(np.int64).max)
    hi = np.full(n, -1)
    for u in range(n):
        lo[block[u]] = min(lo[block[u]], key[u])
        hi[block[u]] = max(hi[block[u]], key[u])
    prod_saves = np.zeros(n_t, np.bool_)
    for j in range(len(s_t)):
        if own[j]:
            prod_saves[s_t[j]] = True

    # per record: members, readers (CSR), their last, the members that are not
    # sequence-parallel; then sizes, copies and anchors
    m_ptr = np.zeros(R + 1, np.int64)
    r_ptr = np.zeros(R + 1, np.int64)
    m_max = np.full(R, -1, np.int64)
    r_max = np.full(R, -1, np.int64)
    unsplit = np.zeros(R, np.int64)
    for k in range(P):
        r = pair_rec[k]
        m_ptr[r + 1] += 1
        m_max[r] = max(m_max[r], uv[k])
        if u_read[k]:
            r_ptr[r + 1] += 1
            r_max[r] = max(r_max[r], uv[k])
        if not seq[uv[k]]:
            unsplit[r] += 1
    for r in range(R):
        m_ptr[r + 1] += m_ptr[r]
        r_ptr[r + 1] += r_ptr[r]
    r_idx = uv[u_read]

    nbytes = np.empty(R)
    moved = np.empty(R)
    lead = np.zeros(R, np.bool_)
    copy_id = np.full(R, -1, np.int64)
    received = np.zeros(R, np.bool_)
    alloc = np.empty((R, 3), np.int64)
    fwd_free = np.empty((R, 3), np.int64)
    model_out = np.zeros(R, np.bool_)
    last_copy = np.full(n_t, -1, np.int64)
    n_cp = 0
    for r in range(R):
        t, pr, mn, home = rec_t[r], rec_prod[r], rec_min[r], rec_home[r]
        prod = max(pr, 0)
        lead[r] = home and prod_saves[t]
        ps = t_per_sample[t]
        size = t_bytes[t] / (M if ps else 1)
        lead_unit = pr if home and pr >= 0 else mn
        share = 1.0 / sa[max(lead_unit, 0)] if ps else 1.0
        # read only inside its producer's block if the block runs whole on one placement
        # (.regions), else by no other unit
        if lo[block[prod]] == hi[block[prod]]:
            internal = t_internal[t]
        else:
            internal = readers_ptr[t + 1] == readers_ptr[t] and not is_output[t]
        stream = t_stream[t]
        split = home and pr >= 0 and p[prod] > 1 and (
            internal and (not stream or seq[prod])       # internal to a split unit (block)
            or (seq[prod] and stream and not is_output[t] and unsplit[r] == 0))
        if split:
            share = share / p[prod]
        moved[r] = charged(size * share, alloc_block)
        # a stream tensor entering a run of sequence-parallel units is scattered there
        # (placements' docstring)
        entry = stream and mn >= 0 and seq[max(mn, 0)] and unsplit[r] == 0 and (
            not home or (pr < 0 or not seq[prod]) and not lead[r])
        nbytes[r] = charged(size * share / p[max(mn, 0)], alloc_block) if entry else moved[r]
        if not home:
            copy_id[r] = n_cp
            n_cp += 1
            last_copy[t] = max(last_copy[t], copy_id[r])
            if staged:      # ... from another stage, with a gradient to compute
                from_unit = pr if pr >= 0 else max(first_user[t], 0)
                received[r] = requires_grad[t] and mn >= 0 and stage[max(mn, 0)] != stage[from_unit]
            _fill(alloc, r, A_XFER, copy_id[r], START)
        else:
            _fill(alloc, r, A_FWD, pr if pr >= 0 else mn, START)
        fwd_last = r_max[r] if r_max[r] >= 0 else (pr if home and pr >= 0 else mn)
        _fill(fwd_free, r, A_FWD, fwd_last, END)
        model_out[r] = home and is_output[t]

    # savers: the producer first of the home record's (it runs before every user), the
    # others ascending
    sv_ptr = np.zeros(R + 1, np.int64)
    for r in range(R):
        sv_ptr[r + 1] = sv_ptr[r] + lead[r]
        for k in range(m_ptr[r], m_ptr[r + 1]):
            sv_ptr[r + 1] += u_save[k]
    sv_idx = np.empty(sv_ptr[R], np.int64)
    j = 0
    for r in range(R):
        pending = lead[r]
        for k in range(m_ptr[r], m_ptr[r + 1]):
            if u_save[k]:
                if pending and rec_prod[r] <= uv[k]:
                    sv_idx[j] = rec_prod[r]
                    j += 1
                    pending = False
                sv_idx[j] = uv[k]
                j += 1
        if pending:
            sv_idx[j] = rec_prod[r]
            j += 1

    # copies: every record off the producer's placement; last copy out of each home
    c_t = np.empty(n_cp, np.int64)
    c_src = np.empty(n_cp, np.int64)
    c_dst = np.empty(n_cp, np.int64)
    c_bytes = np.empty(n_cp)
    c_first = np.empty(n_cp, np.int64)
    c_last = np.empty(n_cp, np.int64)
    c_grad = np.empty(n_cp, np.bool_)
    last_xfer = np.full((R, 3), -1, np.int64)
    for r in range(R):
        t = rec_t[r]
        c = copy_id[r]
        if c >= 0:
            c_t[c], c_src[c], c_dst[c], c_bytes[c] = t, home_t[t], rec_lay[r], moved[r]
            c_first[c], c_last[c] = rec_min[r], m_max[r]
            c_grad[c] = requires_grad[t] and r_max[r] >= 0
        elif last_copy[t] >= 0:
            _fill(last_xfer, r, A_XFER, last_copy[t], END)

    # gradients: of each copy a reader needs, and of the storage itself, allocated by its
    # latest source (the first backward to run)
    best = np.full(n_t, -1, np.int64)
    src_pos = np.empty(R, np.int64)
    for r in range(R):
        t = rec_t[r]
        if rec_home[r]:
            src_pos[r] = n if model_out[r] else r_max[r]
        else:
            src_pos[r] = rec_min[r]
        if requires_grad[t] and (r_max[r] >= 0 or model_out[r]):
            best[t] = max(best[t], src_pos[r])
    G = 0
    for r in range(R):
        t = rec_t[r]
        if requires_grad[t] and (r_max[r] >= 0 or model_out[r]):
            G += 2      # at most a copy's and a storage's
    g_lay = np.empty(G, np.int64)
    g_bytes = np.empty(G)
    g_alloc = np.empty((G, 3), np.int64)
    g_free = np.empty((G, 3), np.int64)
    g = 0
    for r in range(R):      # the copies' first
        t = rec_t[r]
        if copy_id[r] >= 0 and requires_grad[t] and r_max[r] >= 0 and nbytes[r] > 0:
            g_lay[g], g_bytes[g] = rec_lay[r], nbytes[r]
            _fill(g_alloc, g, A_BWD, r_max[r], END)
            _fill(g_free, g, A_GXFER, copy_id[r], END)
            g += 1
    for r in range(R):
        t = rec_t[r]
        if not (requires_grad[t] and (r_max[r] >= 0 or model_out[r])) or src_pos[r] != best[t]:
            continue
        first_any = prod_t[t] if prod_t[t] >= 0 else first_user[t]
        t_share = 1.0 / sa[max(first_any, 0)] if t_per_sample[t] else 1.0
        b = t_bytes[t] / (M if t_per_sample[t] else 1) * t_share
        if not b > 0:
            continue
        g_lay[g], g_bytes[g] = home_t[t], b
        if rec_home[r]:
            _fill(g_alloc, g, A_BWD, last if model_out[r] else r_max[r], END)
        else:
            _fill(g_alloc, g, A_GXFER, copy_id[r], START)
        _fill(g_free, g, A_BWD, first_any, START)
        g += 1

    # per unit, the anchors its forward reads and its backward's incoming gradients
    n_keys = max(n, n_cp, 1)
    a_unit = np.empty(P, np.int64)
    a_kind = np.empty(P, np.int64)
    a_key = np.empty(P, np.int64)
    j = 0
    for k in range(P):
        r = pair_rec[k]
        if copy_id[r] >= 0:
            a_unit[j], a_kind[j], a_key[j] = uv[k], A_XFER, copy_id[r]
            j += 1
        elif rec_prod[r] >= 0:
            a_unit[j], a_kind[j], a_key[j] = uv[k], A_FWD, rec_prod[r]
            j += 1
    reads = _anchor_rows(a_unit[:j], a_kind[:j], a_key[:j], n, n_keys)
    b_unit = np.empty(len(r_idx) + n_t, np.int64)
    b_kind = np.empty(len(b_unit), np.int64)
    b_key = np.empty(len(b_unit), np.int64)
    j = 0
    for r in range(R):
        if rec_prod[r] < 0:
            continue
        back = copy_id[r] >= 0 and requires_grad[rec_t[r]]
        for k in range(r_ptr[r], r_ptr[r + 1]):
            b_unit[j] = rec_prod[r]
            b_kind[j] = A_GXFER if back else A_BWD
            b_key[j] = copy_id[r] if back else r_idx[k]
            j += 1
    for t in range(n_t):
        if is_output[t] and prod_t[t] >= 0 and prod_t[t] != last:
            b_unit[j], b_kind[j], b_key[j] = prod_t[t], A_FWD, last
            j += 1
    grads_in = _anchor_rows(b_unit[:j], b_kind[:j], b_key[:j], n, n_keys)

    # which records read the policy or segment of a unit: their members and producer, per
    # unit ascending (a counting sort over the records in order)
    tc_ptr = np.zeros(n + 1, np.int64)
    for k in range(P):
        tc_ptr[uv[k] + 1] += 1
    for r in range(R):
        if rec_home[r] and rec_prod[r] >= 0:
            tc_ptr[rec_prod[r] + 1] += 1
    for u in range(n):
        tc_ptr[u + 1] += tc_ptr[u]
    tc_idx = np.empty(tc_ptr[n], np.int64)
    fill = tc_ptr[:-1].copy()
    for r in range(R):
        for k in range(m_ptr[r], m_ptr[r + 1]):
            tc_idx[fill[uv[k]]] = r
            fill[uv[k]] += 1
        if rec_home[r] and rec_prod[r] >= 0:
            tc_idx[fill[rec_prod[r]]] = r
            fill[rec_prod[r]] += 1
    kept = model_out & keep_output      # the step keeps the model's outputs (GraphArrays)
    return (rec_t, rec_lay, rec_home, rec_prod, nbytes, alloc, fwd_free, kept, received,
            last_xfer, (m_ptr, uv), (sv_ptr, sv_idx), (r_ptr, r_idx), (tc_ptr, tc_idx),
            (g_lay[:g], g_bytes[:g], g_alloc[:g], g_free[:g]),
            (c_t, c_src, c_dst, c_bytes, c_first, c_last, c_grad), reads, grads_in)
