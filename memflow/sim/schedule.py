"""List scheduling of tasks in program order over serial channels.

``start = max(inputs ready, every channel of the task free)``; the task then holds its channels
until it ends. Tasks come in program order, which is a topological order of the dependencies,
so one pass gives the schedule (FlexFlow's simulator with each channel issuing in order, as a
CUDA stream does).

The pass runs over CSR arrays and is compiled by numba when it is installed (100,000 tasks in
a few milliseconds; see :mod:`memflow.memory.jit`).
"""
from __future__ import annotations

import numpy as np

from ..memory.arrays import csr
from ..memory.jit import JIT, njit

__all__ = ["schedule", "csr", "JIT"]


@njit
def _pass(dep_ptr, dep_idx, task_set, set_ptr, set_idx, dur, n_channels):
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
        s = task_set[i]
        for k in range(set_ptr[s], set_ptr[s + 1]):
            c = set_idx[k]
            if free[c] > t:
                t = free[c]
        start[i] = t
        e = t + dur[i]
        end[i] = e
        for k in range(set_ptr[s], set_ptr[s + 1]):
            free[set_idx[k]] = e
    return start, end


def schedule(deps: tuple[np.ndarray, np.ndarray], task_set: np.ndarray,
             sets: tuple[np.ndarray, np.ndarray], duration: np.ndarray,
             n_channels: int) -> tuple[np.ndarray, np.ndarray]:
    """Start and end time of every task.

    ``deps`` (CSR) lists per task the tasks ``j`` that must end before it starts, or
    ``-(j + 1)`` for tasks that must only have *started*; task ``i`` occupies the channels of
    set ``task_set[i]`` of ``sets`` (CSR).

    >>> s, e = schedule(csr([[], [0], []]), np.array([0, 1, 0]), csr([(0,), (1,)]),
    ...                 np.array([1.0, 2.0, 1.0]), 2)
    >>> s.tolist(), e.tolist()
    ([0.0, 1.0, 1.0], [1.0, 3.0, 2.0])
    """
    return _pass(deps[0], deps[1], np.asarray(task_set, np.int64), sets[0], sets[1],
                 np.ascontiguousarray(duration, np.float64), int(n_channels))
