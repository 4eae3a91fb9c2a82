"""List scheduling of tasks in program order over serial channels.

``start = max(inputs ready, every channel of the task free)``; the task then holds its channels
until it ends. Tasks come in program order, which is a topological order of the dependencies,
so one pass gives the schedule (FlexFlow's simulator with each channel issuing in order, as a
CUDA stream does). Plain Python lists: at a few hundred thousand tasks per second this loop is
not the bottleneck, and it needs no compiler.
"""
from __future__ import annotations

import numpy as np

__all__ = ["schedule"]


def schedule(deps: list[list[int]], channels: list[tuple[int, ...]], duration: np.ndarray,
             n_channels: int) -> tuple[np.ndarray, np.ndarray]:
    """Start and end time of every task.

    ``deps[i]`` lists tasks ``j`` that must end before ``i`` starts, or ``-(j + 1)`` for tasks
    that must only have *started*; ``channels[i]`` the channels ``i`` occupies.

    >>> s, e = schedule([[], [0], []], [(0,), (1,), (0,)], np.array([1.0, 2.0, 1.0]), 2)
    >>> s.tolist(), e.tolist()
    ([0.0, 1.0, 1.0], [1.0, 3.0, 2.0])
    """
    n = len(deps)
    dur = duration.tolist()
    start = [0.0] * n
    end = [0.0] * n
    free = [0.0] * n_channels
    for i in range(n):
        t = 0.0
        for d in deps[i]:
            v = end[d] if d >= 0 else start[-d - 1]
            if v > t:
                t = v
        ch = channels[i]
        for c in ch:
            if free[c] > t:
                t = free[c]
        start[i] = t
        e = t + dur[i]
        end[i] = e
        for c in ch:
            free[c] = e
    return np.array(start), np.array(end)
