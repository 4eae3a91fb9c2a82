"""Block transitions of the checkpointing DP, many at once, compiled.

A transition is one block ``a..b`` of the chain (a kept or offloaded unit, or a segment of
recomputed units) with the policies around it: ``hist``, the ``D+1`` units before ``a``;
``kind``, the block's policy; ``after``, the ``D`` units after ``b``. :func:`block_transitions`
returns, for each, the block's *local peak* — the most bytes live at any start of its forward,
recomputation or backward tasks (and a prefetch during a backward, and a backward's end),
counting the blocks of
units ``a-D … b+D`` that are not already held from before ``a``, plus the parameter gradients
of the units after ``b`` — and the bytes it newly *holds* through unit ``b+1``. These are the
numbers :meth:`~memflow.planners.checkpointing.chain.ChainMemory.transition` defines; here one
compiled loop computes thousands of them, so a 100-unit chain's table is built in well under a
second.

The memory blocks come from :class:`~memflow.planners.checkpointing.chain.ChainMemory`'s flat
table: ``ctx_id[v, code]`` is the row range (``start``, ``stop``) of unit ``v``'s blocks when
the policies of units ``v-1 … v+D`` are ``code`` (base-5 digits, :data:`BASE`); each block has
its bytes, allocating anchor, three candidate freeing anchors and whether it is a parameter
gradient (``tail``).
"""
from __future__ import annotations

import numpy as np

from ...memory.blocks import A_BWD, A_RECOMP
from ...memory.jit import njit
from .order import bwd_end, position

__all__ = ["block_transitions", "context_code", "BASE"]

BASE = 5      # policy codes KEEP_, REC_, OFF_, START_, END_ (chain.py) are digits below it
_KEEP, _REC, _START, _END = 0, 1, 3, 4


def context_code(ctx: tuple[int, ...]) -> int:
    """The integer of a context (policies of units ``v-1 … v+D``), first unit least.

    >>> context_code((1, 0, 4))
    101
    """
    return sum(int(x) * BASE ** i for i, x in enumerate(ctx))


@njit
def _policy(v, a, b, n, D, hist, kind, after):
    # the policy of unit v in a transition; units beyond its window are kept
    if v < 0:
        return _START
    if v >= n:
        return _END
    if v < a:
        return hist[v - (a - D - 1)] if v >= a - D - 1 else _KEEP
    if v <= b:
        return kind
    if v <= b + D:
        return after[v - b - 1]
    return _KEEP


@njit
def _one(a, b, n, D, hist, kind, after, ctx_id, start, stop, nbytes, alloc, free, tail,
         tail_after):
    lo_w, hi_w = a - D - 1, b + D          # the window of known policies
    # segment end of each unit of the window (a run of recomputed units ends where it ends
    # inside the window); units outside the window are their own segment
    seg = np.empty(hi_w - lo_w + 1, np.int64)
    run_end = -1
    for i in range(hi_w - lo_w, -1, -1):
        v = lo_w + i
        if 0 <= v < n and _policy(v, a, b, n, D, hist, kind, after) == _REC:
            if run_end < 0:
                run_end = v
            seg[i] = run_end
        else:
            run_end = -1
            seg[i] = v
    # the blocks of units a-D … b+D, with their group: 0 before the block, 1 in it, 2 after
    first, last = max(0, a - D), min(n - 1, b + D)
    rows = np.empty(last - first + 1, np.int64)
    count = 0
    for v in range(first, last + 1):
        code = 0
        for i in range(D + 2):
            code += _policy(v - 1 + i, a, b, n, D, hist, kind, after) * BASE ** i
        k = ctx_id[v, code]
        if k < 0:
            return np.nan, np.nan
        count += stop[k] - start[k]
        rows[v - first] = k
    m = count
    group = np.empty(m, np.int64)
    size = np.empty(m)
    at_alloc = np.empty(m, np.int64)
    at_free = np.empty(m, np.int64)
    is_tail = np.empty(m, np.bool_)
    j = 0
    for r in range(len(rows)):
        v = first + r
        g = 0 if v < a else (1 if v <= b else 2)
        k = rows[r]
        for x in range(start[k], stop[k]):
            group[j], size[j], is_tail[j] = g, nbytes[x], tail[x]
            u = min(max(alloc[x, 1], 0), n - 1)
            su = seg[u - lo_w] if lo_w <= u <= hi_w else u
            p = position(alloc[x, 0], alloc[x, 1], alloc[x, 2], n, su)
            f = p + 2 if p % 4 == 0 else p     # never before its allocating task ends
            for c in range(3):
                u = min(max(free[x, c, 1], 0), n - 1)
                su = seg[u - lo_w] if lo_w <= u <= hi_w else u
                f = max(f, position(free[x, c, 0], free[x, c, 1], free[x, c, 2], n, su))
            at_alloc[j], at_free[j] = p, f
            j += 1
    end_a = bwd_end(a, n)
    keep = np.empty(m, np.bool_)
    before = np.empty(m, np.bool_)
    for j in range(m):
        before[j] = group[j] == 0 and at_alloc[j] <= 4 * a and at_free[j] >= end_a
        keep[j] = not (before[j] or (group[j] == 2 and is_tail[j]))
    # the block's task starts: forward, backward (and a prefetch during it), recomputation;
    # and the backward's end, where the gradients it made appear before its temporaries go
    recomputed = _policy(a, a, b, n, D, hist, kind, after) == _REC
    per = 5 if recomputed else 4
    events = np.empty(per * (b - a + 1), np.int64)
    for u in range(a, b + 1):
        su = seg[u - lo_w]
        bw = position(A_BWD, u, 0, n, su)
        e = per * (u - a)
        events[e], events[e + 1], events[e + 2], events[e + 3] = 4 * u, bw, bw + 1, bw + 2
        if recomputed:
            events[e + 4] = position(A_RECOMP, u, 0, n, su)
    # each kept block is live over a contiguous run of the sorted events: add its bytes to
    # the run's ends, then sum along the events (m log E for m blocks and E events)
    events.sort()
    lo = np.searchsorted(events, at_alloc, "left")
    hi = np.searchsorted(events, at_free, "right")
    diff = np.zeros(len(events) + 1)
    for j in range(m):
        if keep[j]:
            diff[lo[j]] += size[j]
            diff[hi[j]] -= size[j]
    local, live = 0.0, 0.0
    for e in range(len(events)):
        live += diff[e]
        local = max(local, live + (tail_after[b] if events[e] >= 4 * n else 0.0))
    held = 0.0
    if b + 1 < n:
        end_next = bwd_end(b + 1, n)
        for j in range(m):
            if group[j] <= 1 and not before[j] and at_alloc[j] <= 4 * (b + 1) \
                    and at_free[j] >= end_next:
                held += size[j]
    return local, held


@njit
def block_transitions(a, b, hist, kind, after, n, D, ctx_id, start, stop, nbytes, alloc, free,
                      tail, tail_after):
    """Local peak and newly held bytes of each transition ``(a[i], b[i], hist[i], kind[i],
    after[i])``; NaN where a unit's context was never probed."""
    local = np.empty(len(a))
    held = np.empty(len(a))
    for i in range(len(a)):
        local[i], held[i] = _one(a[i], b[i], n, D, hist[i], kind[i], after[i], ctx_id, start,
                                 stop, nbytes, alloc, free, tail, tail_after)
    return local, held
