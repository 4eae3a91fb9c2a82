"""The blocks of one training step, as :class:`~memflow.memory.table.BlockTable` derives
them: one entry per block that holds bytes, plus the copies between placements."""
from __future__ import annotations

from functools import cached_property

import numpy as np

from .records import A_BWD, A_COMPRESS, A_FWD, A_OFFLOAD, A_RECOMP, A_XFER, Copies
from .slots import ACTIVATIONS, EVERY_MB

__all__ = ["StepBlocks"]


class StepBlocks:
    """Blocks (one entry per block in each array) plus the copies between placements.

    Made from the fixed rows of a :class:`BlockTable` (``rows``: their arrays, a snapshot of
    the policy-dependent ones); the arrays below keep the rows that hold bytes.
    """

    def __init__(self, rows: dict[str, np.ndarray], copies: Copies, offloaded: np.ndarray,
                 compressed: np.ndarray, persistent: np.ndarray, segment: np.ndarray,
                 segment_start: np.ndarray, microbatches: int):
        self.rows = rows
        self.segment = segment            # the recompute segments that run (holding_segments)
        self.segment_start = segment_start    # segment_starts(segment)
        self.microbatches = microbatches
        self.copies = copies
        self.offloaded = offloaded        # per unit: bytes per part its offload task moves
        self.compressed = compressed      # per unit: bytes per part its compress task reads
        self.persistent = persistent      # (layouts, categories) bytes per part, whole step

    @cached_property
    def _kept(self) -> np.ndarray:
        return self.rows["bytes"] > 0

    def _column(self, name: str) -> np.ndarray:
        return self.rows[name][self._kept]

    @cached_property
    def layout(self) -> np.ndarray:
        return self._column("layout")

    @cached_property
    def on_host(self) -> np.ndarray:
        return self._column("host")

    @cached_property
    def bytes(self) -> np.ndarray:
        return self._column("bytes")

    @cached_property
    def category(self) -> np.ndarray:
        return self._column("category")

    @cached_property
    def per_mb(self) -> np.ndarray:
        """EVERY_MB: one block per micro-batch; FIRST_MB: one per step."""
        return self._column("per_mb")

    @cached_property
    def alloc(self) -> np.ndarray:
        """(k, 3) anchors."""
        return self._column("alloc")

    @cached_property
    def free(self) -> np.ndarray:
        """(k, 3, 3) anchors: freed at the latest of the three."""
        return self._column("free")

    def held_for_backward(self) -> tuple[np.ndarray, np.ndarray]:
        """Bytes per part held for backward at the end of the forward, per placement:
        ``(on the device, on the host)``, every micro-batch's (GPipe holds them all).

        On the device: activations allocated in the forward (by a forward, a transfer, an
        offload or compress task) and held until a backward ends (``keep``, segment inputs),
        and compressed copies; on the host: offloaded copies.

        >>> import pandas as pd
        >>> from memflow.graph import OpGraph
        >>> from memflow.memory.arrays import graph_arrays
        >>> g = OpGraph(pd.DataFrame({"fwd_flops": [1.0, 1.0], "bwd_flops": [2.0, 2.0]},
        ...                          index=["a", "b"]),
        ...             pd.DataFrame({"bytes": [100, 200, 300], "producer": ["<input>", "a", "b"],
        ...                           "consumers": [["a"], ["b"], []],
        ...                           "savers": [["a"], ["b"], []], "is_output": [0, 0, 1]}))
        >>> from memflow.memory.blocks import step_blocks
        >>> from memflow.strategy import KEEP, OFFLOAD
        >>> plan = step_blocks(graph_arrays(g), np.array([KEEP, OFFLOAD]), np.array([-1, -1]),
        ...                    np.zeros(2, np.int64), np.ones((1, 3), np.int64), 1, np.ones(2))
        >>> [a.tolist() for a in plan.held_for_backward()]     # t0 kept; t1 on the host
        [[100.0], [200.0]]
        """
        alloc = self.alloc[:, 0]
        in_forward = np.isin(alloc, (A_FWD, A_XFER, A_COMPRESS, A_OFFLOAD))
        to_backward = ((self.free[:, :, 0] == A_BWD) | (self.free[:, :, 0] == A_RECOMP)).any(1)
        act = self.category == ACTIVATIONS
        device = act & ~self.on_host & in_forward & (to_backward | (alloc == A_COMPRESS))
        host = act & self.on_host & (alloc == A_OFFLOAD)
        b = self.bytes * np.where(self.per_mb == EVERY_MB, self.microbatches, 1)
        n = len(self.persistent)
        return (np.bincount(self.layout[device], b[device], n),
                np.bincount(self.layout[host], b[host], n))
