"""List scheduling of tasks in program order over serial channels.

``start = max(inputs ready, every channel of the task free)``; the task then holds its channels
until it ends. Tasks come in program order, which is a topological order of the dependencies,
so one pass gives the schedule (FlexFlow's simulator with each channel issuing in order, as a
CUDA stream does).

The pass runs over CSR arrays; when numba is installed it is compiled (about 100× faster than
the interpreter: 100,000 tasks in a few milliseconds), otherwise the same function runs as
Python.
"""
from __future__ import annotations

import numpy as np

__all__ = ["schedule", "csr", "JIT"]


def _pass(dep_ptr, dep_idx, ch_ptr, ch_idx, dur, n_channels):  # pragma: no cover - jitted
    n = len(dur)
    start = np.zeros(n)
    end = np.zeros(n)
    free = np.zeros(n_channels)
    for i in range(n):
        t = 0.0
        for k in range(dep_ptr[i], dep_ptr[i + 1]):
            d = dep_idx[k]
            v = end[d] if d >= 0 else start[-d - 1]
            if v > t:
                t = v
        for k in range(ch_ptr[i], ch_ptr[i + 1]):
            c = ch_idx[k]
            if free[c] > t:
                t = free[c]
        start[i] = t
        e = t + dur[i]
        end[i] = e
        for k in range(ch_ptr[i], ch_ptr[i + 1]):
            free[ch_idx[k]] = e
    return start, end


try:
    import numba
    _run = numba.njit(cache=True, nogil=True)(_pass)
    JIT = True
except ImportError:  # numba is optional: the same pass, interpreted
    _run = _pass
    JIT = False


def csr(rows: list) -> tuple[np.ndarray, np.ndarray]:
    """``(ptr, idx)`` of a list of integer sequences.

    >>> [a.tolist() for a in csr([[1, 2], [], [3]])]
    [[0, 2, 2, 3], [1, 2, 3]]
    """
    lens = np.fromiter((len(r) for r in rows), np.int64, len(rows))
    ptr = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(lens, out=ptr[1:])
    idx = np.fromiter((x for r in rows for x in r), np.int64, int(ptr[-1]))
    return ptr, idx


def schedule(deps: tuple[np.ndarray, np.ndarray], channels: tuple[np.ndarray, np.ndarray],
             duration: np.ndarray, n_channels: int) -> tuple[np.ndarray, np.ndarray]:
    """Start and end time of every task.

    ``deps`` (CSR) lists per task the tasks ``j`` that must end before it starts, or
    ``-(j + 1)`` for tasks that must only have *started*; ``channels`` (CSR) the channels it
    occupies.

    >>> s, e = schedule(csr([[], [0], []]), csr([(0,), (1,), (0,)]), np.array([1.0, 2.0, 1.0]), 2)
    >>> s.tolist(), e.tolist()
    ([0.0, 1.0, 1.0], [1.0, 3.0, 2.0])
    """
    return _run(deps[0], deps[1], channels[0], channels[1],
                np.ascontiguousarray(duration, np.float64), int(n_channels))
