"""PyTorch's CUDA caching allocator, modelled: what a tensor really takes, and what is reserved.

memflow's memory model counts a tensor at its bytes. On a GPU, PyTorch's caching allocator
(``c10/cuda/CUDACachingAllocator.cpp``, the native backend) hands out *blocks*:

* every request is rounded up to a multiple of ``MIN_BLOCK`` = 512 B (at least 512 B):
  :func:`round_size` — what ``torch.cuda.memory_allocated`` counts when blocks split exactly;
* blocks are cut from *segments* it gets from ``cudaMalloc``: a request of at most
  ``SMALL_SIZE`` = 1 MiB from the small pool, whose segments are ``SMALL_BUFFER`` = 2 MiB;
  a larger one from the large pool, in a ``LARGE_BUFFER`` = 20 MiB segment below
  ``MIN_LARGE_ALLOC`` = 10 MiB, else in one of its own size rounded up to ``ROUND_LARGE`` =
  2 MiB: :func:`segment_size`;
* a freed block stays in its segment for reuse (merged with free neighbours); segments are
  never returned (without ``empty_cache`` or an out-of-memory retry), so
  ``torch.cuda.memory_reserved`` only grows: :class:`CachingAllocator` replays a sequence of
  allocations and frees with the allocator's rules — best fit in the request's pool, a block
  split only when the rest is at least 512 B (small pool) or more than 1 MiB (large pool),
  otherwise handed out whole — and gives the allocated and reserved bytes and their peaks.

It models the default configuration (no ``max_split_size_mb``, ``roundup_power2_divisions``
or expandable segments) on one stream. The memory model uses :func:`round_size` per tensor
when asked (``allocator="cuda"``, :func:`charged`); the replay estimates reserved
bytes from the same events.

>>> round_size(1), round_size(513), segment_size(1000) == SMALL_BUFFER
(512, 1024, True)
>>> a = CachingAllocator()
>>> x = a.malloc(1000); y = a.malloc(5 * MIB)
>>> a.allocated, a.reserved == SMALL_BUFFER + LARGE_BUFFER
(5243904, True)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Iterable

import numpy as np

from .jit import njit

__all__ = ["round_size", "segment_size", "block_of", "charged", "CachingAllocator", "replay",
           "ALLOCATORS", "MIN_BLOCK", "SMALL_SIZE", "SMALL_BUFFER", "LARGE_BUFFER",
           "MIN_LARGE_ALLOC", "ROUND_LARGE", "MIB", "CUBLAS_WORKSPACE", "STEP_WORKSPACES"]

MIB = 1 << 20
# The constants of CUDACachingAllocator.cpp (kMinBlockSize, kSmallSize, kSmallBuffer,
# kLargeBuffer, kMinLargeAlloc, kRoundLarge).
MIN_BLOCK = 512
SMALL_SIZE = MIB
SMALL_BUFFER = 2 * MIB
LARGE_BUFFER = 20 * MIB
MIN_LARGE_ALLOC = 10 * MIB
ROUND_LARGE = 2 * MIB

CUBLAS_WORKSPACE = 32 * MIB
"""The workspace cuBLAS keeps, through the caching allocator, for each thread that runs a
matrix product: the training loop's and autograd's backward thread, two in a step. Measured on
an H200 (torch 2.11: 33,554,432 bytes each, ``benchmarks/bench_gpu.py``), PyTorch's default on
Hopper (``CUBLAS_WORKSPACE_CONFIG`` changes it). cuDNN's convolution workspaces are transient
and chosen per algorithm: not modelled (hundreds of MB for a large 3×3 convolution)."""
STEP_WORKSPACES = 2
"""Threads of a training step that run matrix products (the loop's, autograd's)."""

ALLOCATORS = (None, "cuda")
"""What the memory model may charge a tensor: its bytes (None) or the CUDA block (``"cuda"``)."""


def round_size(nbytes: int) -> int:
    """Bytes of the block a request of ``nbytes`` gets: a multiple of 512, at least 512.

    >>> round_size(0), round_size(512), round_size(1_000_000)
    (512, 512, 1000448)
    """
    return MIN_BLOCK * max(1, -(-int(nbytes) // MIN_BLOCK))


def segment_size(nbytes: int) -> int:
    """Bytes of the segment ``cudaMalloc``-ed when no free block fits a (rounded) request.

    >>> [segment_size(n) // MIB for n in (MIB, MIB + 512, 10 * MIB, 11 * MIB)]
    [2, 20, 10, 12]
    """
    if nbytes <= SMALL_SIZE:
        return SMALL_BUFFER
    if nbytes < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * -(-int(nbytes) // ROUND_LARGE)


def block_of(allocator: str | None) -> float:
    """The block ``allocator`` rounds a tensor's bytes up to, 0.0 for none (None).

    >>> block_of(None), block_of("cuda")
    (0.0, 512.0)
    """
    if allocator not in ALLOCATORS:
        raise ValueError(f"allocator must be one of {ALLOCATORS}, got {allocator!r}")
    return 0.0 if allocator is None else float(MIN_BLOCK)


@njit
def charged(nbytes: float, block: float) -> float:
    """Bytes charged for a tensor of ``nbytes``: as they are (``block`` 0.0) or rounded up to
    a multiple of ``block`` (:func:`block_of`), at least one block; an empty tensor takes none.
    Fractions (a tensor's share of a split unit) are charged per part, rounded up as the part
    would be. Scalar, for the compiled passes of :mod:`memflow.memory.records`.

    >>> [charged(x, block_of("cuda")) for x in (0.0, 100.0, 1024.5)], charged(7.5, 0.0)
    ([0.0, 512.0, 1536.0], 7.5)
    """
    if block == 0.0:
        return nbytes
    return block * max(1.0, np.ceil(nbytes / block)) if nbytes > 0 else 0.0


@dataclass(eq=False)
class _Block:
    segment: int
    offset: int
    size: int
    small: bool
    free: bool = True
    prev: "_Block | None" = None
    next: "_Block | None" = None


class CachingAllocator:
    """A replay of the CUDA caching allocator (see the module's notes). ``malloc`` returns a
    handle for ``free``; ``allocated``/``reserved`` and ``peak_allocated``/``peak_reserved``
    follow ``torch.cuda.memory_allocated``/``memory_reserved`` and their maxima."""

    def __init__(self) -> None:
        self._free: list[_Block] = []
        self._used: dict[int, _Block] = {}
        self._handles = 0
        self.segments = 0
        self.allocated = self.reserved = self.peak_allocated = self.peak_reserved = 0

    def malloc(self, nbytes: int) -> int:
        """Allocate ``nbytes``; the handle to free it."""
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        fits = [b for b in self._free if b.small == small and b.size >= size]
        if fits:      # best fit: the smallest block, then the oldest segment, the lowest address
            block = min(fits, key=lambda b: (b.size, b.segment, b.offset))
            self._free.remove(block)
        else:
            block = _Block(self.segments, 0, segment_size(size), small)
            self.segments += 1
            self.reserved += block.size
        rest = block.size - size
        if (rest >= MIN_BLOCK) if small else (rest > SMALL_SIZE):
            tail = _Block(block.segment, block.offset + size, rest, small, True, block, block.next)
            if block.next is not None:
                block.next.prev = tail
            block.next, block.size = tail, size
            self._free.append(tail)
        block.free = False
        self.allocated += block.size
        self._handles += 1
        self._used[self._handles] = block
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        return self._handles

    def free(self, handle: int) -> None:
        """Return a block to its segment, merged with its free neighbours."""
        block = self._used.pop(handle)
        self.allocated -= block.size
        block.free = True
        for other in (block.prev, block.next):
            if other is not None and other.free:
                self._free.remove(other)
                first, second = (other, block) if other is block.prev else (block, other)
                first.size += second.size
                first.next = second.next
                if second.next is not None:
                    second.next.prev = first
                block = first
        self._free.append(block)


def replay(events: Iterable[tuple[Hashable, float]]) -> CachingAllocator:
    """Run ``(key, bytes)`` events through a :class:`CachingAllocator`: positive bytes
    allocate a tensor under ``key``, negative bytes free the tensor held under ``key``, zero
    bytes (an empty tensor, which takes no block) are skipped.

    >>> a = replay([("x", 3 * MIB), ("y", 3 * MIB), ("x", -3 * MIB), ("z", 2 * MIB)])
    >>> a.peak_allocated // MIB, a.reserved // MIB, a.segments
    (6, 20, 1)
    """
    alloc = CachingAllocator()
    live: dict[Hashable, int] = {}
    for key, nbytes in events:
        if nbytes > 0:
            live[key] = alloc.malloc(int(nbytes))
        elif nbytes < 0:
            alloc.free(live.pop(key))
    return alloc
