"""The seeds' techniques as planners, each simulated by memflow's simulator.

* :func:`hybrid_projection` — data × model parallelism projected end to end with a
  statistical-efficiency model (Pal et al.).
* :func:`offload` / :func:`offload_table` — vDNN's static and dynamic policies and two
  heuristics after Beaumont et al. (Euro-Par 2020).
* :func:`pipeline` / :func:`pipeline_table` — stages and micro-batches under per-stage memory,
  as an ILP (HiGHS) with a dynamic-programming fallback (Beaumont et al., Euro-Par 2021).
* :func:`checkpoint` / :func:`checkpoint_table` — recomputation on one device (Chen et al.'s
  √n, Griewank's revolve, recompute-all, the optimal chain schedule), edge boards included.
* :func:`optimal_checkpointing` — the optimal keep/recompute schedule of a chain, an exact
  dynamic program after rotor (:mod:`memflow.planners.checkpointing`).
* :func:`selective_plan` — keep or selective recomputation per unit (per operation on leaf
  units) under a budget of bytes held for backward, an ILP (HiGHS) over the storages.
* :func:`compress` / :func:`compress_strategy` — COMET's error-bounded compression of saved
  activations: ratios charged and measured, memory, gradient error, the batch it allows.

**Infeasible plans.** Every planner that returns a :class:`~memflow.Strategy` returns one that
fits the memory limit in simulation, or raises :class:`Infeasible` (a
:class:`~memflow.errors.PlanError`) carrying the smallest peak memory it found
(``min_memory``, bytes) and the strategy that reached it (``best``). Planners that return a
table mark such rows ``fits``/``feasible`` False instead. Every strategy a planner returns can
start a search: ``memflow.MCMCSearch(graph, cluster, init=strategy)``, or
:func:`memflow.search.refine`, which reports the search's best beside the plan.

>>> import memflow
>>> memflow.planners.offload, memflow.planners.Infeasible.__mro__[1].__name__   # doctest: +ELLIPSIS
(<function offload at ...>, 'PlanError')
"""
from .batch import at_batch
from .checkpoint import checkpoint, checkpoint_table
from .checkpointing import CheckpointResult, chain_violation, optimal_checkpointing
from .common import Infeasible
from .compress import compress, compress_strategy
from .convergence import CriticalBatch, Measured
from .hybrid import hybrid_projection
from .offload import offload, offload_table
from .pipeline import pipeline, pipeline_table
from .selective import selective_plan

__all__ = ["Infeasible", "CriticalBatch", "Measured", "at_batch", "checkpoint",
           "checkpoint_table", "optimal_checkpointing", "CheckpointResult", "chain_violation",
           "hybrid_projection", "offload", "offload_table", "pipeline", "pipeline_table",
           "compress", "compress_strategy", "selective_plan"]
