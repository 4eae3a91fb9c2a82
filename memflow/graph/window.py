"""The bytes one span allocates and frees while it runs, for its transient peaks (capture's
``fwd_tmp_bytes``, ``bwd_tmp_bytes`` and ``unpack_tmp_bytes``; :mod:`memflow.graph.recorder`)."""
from __future__ import annotations

from typing import Iterable

from torch.multiprocessing.reductions import StorageWeakRef

__all__ = ["Window"]


class Window:
    """Bytes allocated during one span and still alive, and their peak.

    *Credits* are storages alive before the span that the memory model lets go when the
    span's backward starts (what the span saved, the gradients it consumes): PyTorch frees
    them node by node as the span runs, so from the moment one dies its bytes make room for
    the span's allocations. ``live`` is the span's allocations alive minus the credits freed.

    *Saved* credits are what the span saved; ``unpacked`` is the peak of the live bytes as they
    would be were they compressed: their freeing makes no room, and the autograd node running
    holds what it saved decompressed (``unpacking``) — PyTorch's unpack hooks run node by node;
    ``done`` is what the nodes run before had unpacked (at the peak: ``done_at_peak``), whose
    compressed packs are gone.

    >>> import torch
    >>> saved, grad = torch.zeros(4), torch.zeros(8)
    >>> w = Window(saved=[(StorageWeakRef(saved.untyped_storage()), 16)])
    >>> w.add(StorageWeakRef(grad.untyped_storage()), 32)
    >>> del saved
    >>> w.unpack(node=7, nbytes=16)     # node 7 runs: 16 bytes decompressed; ``saved`` is gone
    >>> w.close_backward(), w.unpacked, w.close_unpacked()
    (16, 48, 16)
    """

    __slots__ = ("items", "live", "peak", "credits", "saved", "saved_gone", "node", "unpacking",
                 "unpacked", "done", "done_at_peak")

    def __init__(self, credits: Iterable[tuple[StorageWeakRef, int]] = (),
                 saved: Iterable[tuple[StorageWeakRef, int]] = ()) -> None:
        self.items: list[tuple[StorageWeakRef, int]] = []
        self.live = 0
        self.peak = 0
        self.credits = [c for c in credits if not c[0].expired()]
        self.saved = [c for c in saved if not c[0].expired()]
        self.saved_gone = self.unpacking = self.unpacked = self.done = self.done_at_peak = 0
        self.node = -1

    def poll(self) -> None:
        """Forget storages that were freed since the last poll."""
        for name in ("items", "credits", "saved"):
            items = getattr(self, name)
            if items:
                kept = [item for item in items if not item[0].expired()]
                if len(kept) != len(items):
                    setattr(self, name, kept)
                    gone = sum(n for _, n in items) - sum(n for _, n in kept)
                    self.live -= gone
                    if name == "saved":
                        self.saved_gone += gone

    def unpack(self, node: int, nbytes: int) -> None:
        """Autograd node ``node`` runs; it saved ``nbytes`` (decompressed, they are alive)."""
        self.poll()
        if node != self.node:
            self.node, self.done, self.unpacking = node, self.done + self.unpacking, nbytes
        self._unpacked()

    def _unpacked(self) -> None:
        level = self.live + self.saved_gone + self.unpacking
        if level > self.unpacked:
            self.unpacked, self.done_at_peak = level, self.done

    def add(self, ref: StorageWeakRef, nbytes: int) -> None:
        self.items.append((ref, nbytes))
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        self._unpacked()

    def credit(self, nbytes: int) -> None:
        """A storage the memory model counted before the span was freed during it."""
        self.live -= nbytes

    def close(self) -> int:
        """Forward: peak minus what survives the span (its outputs, what it saves)."""
        self.poll()
        return self.peak - sum(n for _, n in self.items)

    def close_backward(self) -> int:
        """Backward: peak above the larger of the bytes held at the span's start and at its
        end. The memory model charges it from the backward's start, when what the span held
        goes, to its end, when the gradients it made appear (``docs/data-model.md``)."""
        self.poll()
        return self.peak - max(0, self.live)

    def close_unpacked(self) -> int:
        """:meth:`close_backward` were what the span saved compressed (after it)."""
        return self.unpacked - max(0, self.live + self.saved_gone)
