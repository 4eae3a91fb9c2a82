"""The anchors of the memory plan: the tasks whose start or end allocates or frees a block.

An anchor is ``(kind, key, edge)``: the kind of task (:data:`ANCHORS`), its key (a unit, a
copy, a layout) and whether its start or its end (:data:`START`, :data:`END`).
"""
from __future__ import annotations

__all__ = ["ANCHORS", "ANCHOR_KINDS", "A_FWD", "A_BWD", "A_RECOMP", "A_OFFLOAD", "A_PREFETCH",
           "A_COMPRESS", "A_DECOMP", "A_XFER", "A_GXFER", "A_OPT", "START", "END"]

# the tasks whose start or end allocates or frees a block (see memflow.memory.blocks):
# "transfer" is a copy's transfer to its readers' placement, "gradient-transfer" its gradient's
# way back
ANCHORS = ("forward", "backward", "recompute", "offload", "prefetch", "compress", "decompress",
           "transfer", "gradient-transfer", "optimizer")
A_FWD, A_BWD, A_RECOMP, A_OFFLOAD, A_PREFETCH, A_COMPRESS, A_DECOMP, A_XFER, A_GXFER, \
    A_OPT = range(len(ANCHORS))
ANCHOR_KINDS = len(ANCHORS)
START, END = 0, 1
