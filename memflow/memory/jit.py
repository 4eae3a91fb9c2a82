"""The compiler of memflow's inner loops: numba when installed, else plain Python.

The loops (the memory policies' rules per record, task expansion, list scheduling, the
memory ledger's sweep) are written in the
subset of Python and numpy that numba compiles; ``cache=True`` keeps the machine code between
processes. Without numba the same functions run interpreted (same results, about 100× slower).

>>> from memflow.sim.schedule import schedule   # one of the compiled loops
>>> JIT in (True, False)
True
"""
from __future__ import annotations

from typing import Callable, TypeVar

__all__ = ["njit", "JIT"]

F = TypeVar("F", bound=Callable)

try:
    import numba

    def njit(fn: F) -> F:
        """Compile ``fn`` with numba (cached on disk, releasing the GIL)."""
        return numba.njit(cache=True, nogil=True)(fn)

    JIT = True
except ImportError:  # numba is optional: the same loops, interpreted
    def njit(fn: F) -> F:
        """numba is not installed: ``fn`` runs as Python."""
        return fn

    JIT = False
