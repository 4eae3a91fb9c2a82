"""The rows of a step's memory plan: block categories, the slots of a record, a unit and its
model states, and how anchors are written into them (:mod:`memflow.memory.blocks`)."""
from __future__ import annotations

from ..strategy.policies import MECHANISMS
from ..strategy.shard_levels import OPTIMIZERS
from .jit import njit

__all__ = ["CATEGORIES", "SLOTS", "UNIT_SLOTS", "STATE_SLOTS", "OPTIMIZER_STATES", "FIRST_MB",
           "EVERY_MB"]

CATEGORIES = ("weights", "gradients", "optimizer", "activations", "transient", "communication")
WEIGHTS, GRADIENTS, OPTIMIZER, ACTIVATIONS, TRANSIENT, COMMUNICATION = range(len(CATEGORIES))
SLOTS = ("produced", "stored", "restored", "rematerialized")
"""The block rows of one record: the storage as produced (or copied), its stored copy
(compressed on the device or offloaded to the host), the copy restored before backward, and
the storage re-materialized by its segment's recomputation."""
PRODUCED, STORED, RESTORED, REMAT = range(len(SLOTS))
UNIT_SLOTS = ("forward temporaries", "backward temporaries", "recompute temporaries",
              "parameter gradients", "cached outputs")
"""The block rows of one unit; "cached outputs" are a selective unit's expensive outputs
used only inside it, held from its forward to its recomputation."""
FWD_TMP, BWD_TMP, REC_TMP, PARAM_GRAD, CACHED = range(len(UNIT_SLOTS))
FIRST_MB, EVERY_MB = 0, 1
STATE_SLOTS = {"gathered for forward": (COMMUNICATION, EVERY_MB),
               "gathered for backward": (COMMUNICATION, EVERY_MB),
               "gathered for recompute": (COMMUNICATION, EVERY_MB),
               "unsharded gradients": (COMMUNICATION, EVERY_MB),
               "host optimizer state": (OPTIMIZER, FIRST_MB)}
"""The model-state block rows of one unit (:mod:`memflow.memory.states`), each with its
category and whether it recurs every micro-batch: zero bytes unless the unit is sharded or
offloads its optimizer. Gathered parameters and a gradient before its reduce-scatter are
short-lived communication buffers (ZeRO's "temporary buffers"), not model states."""
GATHER_FWD, GATHER_BWD, GATHER_REC, UNSHARDED, HOST_STATE = range(len(STATE_SLOTS))
NS, NU, NM = len(SLOTS), len(UNIT_SLOTS), len(STATE_SLOTS)
OPTIMIZER_STATES = {k: n * (w or 4) / 4 for k, (n, w) in OPTIMIZERS.items()}
"""Optimizer state bytes per fp32 trainable byte (:data:`memflow.strategy.OPTIMIZERS`;
``adam8bit``: 0.5)."""
NONE = -1           # a record no saver on its placement holds
N_MECH = len(MECHANISMS)


@njit
def _set(a, row, slot, kind, key, edge):
    a[row, slot, 0], a[row, slot, 1], a[row, slot, 2] = kind, key, edge

