"""The kinds of the simulator's tasks and the roles of the channels they occupy.

Every task of a step (:class:`~memflow.sim.expand.Tasks`) has a ``kind`` and a ``role``, both
integer codes into the tuples declared here; :attr:`memflow.SimResult.timeline` shows the
names. Planners and searches that read a simulated run's tasks compare with the codes.

* :data:`TASK_KINDS` — what the task does: a unit's ``forward``, ``backward`` or
  ``recompute``; a ``transfer`` of a storage copy (or of its gradient back) between
  placements; a DDP gradient ``allreduce``; an ``offload`` to the host and the ``prefetch``
  back; a ``compress`` after forward and the ``decompress`` before backward; the
  ``optimizer`` step of one placement; a sharded unit's ``allgather`` of its parameters
  (before its forward, backward and recomputation) and ``reducescatter`` of its gradients
  (after its backward), as FSDP runs them.
* :data:`ROLES` — which channels of its placement it occupies: ``compute`` (the devices),
  ``comm`` (their collectives), ``to-host`` and ``from-host`` (the host link), ``copy`` and
  ``copy-back`` (the links of a copy between placements, forward and gradient).

>>> TASK_KINDS[K_PREFETCH], ROLES[R_H2D]
('prefetch', 'from-host')
"""
from __future__ import annotations

__all__ = ["TASK_KINDS", "ROLES",
           "K_FWD", "K_BWD", "K_RECOMP", "K_XFER", "K_ALLRED", "K_OFFLOAD", "K_PREFETCH",
           "K_COMPRESS", "K_DECOMP", "K_OPT", "K_GATHER", "K_SCATTER",
           "R_COMPUTE", "R_COMM", "R_D2H", "R_H2D", "R_COPY", "R_COPYBACK"]

TASK_KINDS = ("forward", "backward", "recompute", "transfer", "allreduce", "offload", "prefetch",
              "compress", "decompress", "optimizer", "allgather", "reducescatter")
(K_FWD, K_BWD, K_RECOMP, K_XFER, K_ALLRED, K_OFFLOAD, K_PREFETCH, K_COMPRESS, K_DECOMP, K_OPT,
 K_GATHER, K_SCATTER) = range(len(TASK_KINDS))
ROLES = ("compute", "comm", "to-host", "from-host", "copy", "copy-back")
R_COMPUTE, R_COMM, R_D2H, R_H2D, R_COPY, R_COPYBACK = range(len(ROLES))
