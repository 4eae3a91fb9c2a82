"""memflow's search: a memory-aware MCMC search and the exact references it is measured by.

* :class:`MCMCSearch` — Metropolis search over parallel configurations and memory policies,
  incremental (``step``/``run``), steerable (``pin``/``unpin``), resumable (``save``/``load``);
* :func:`run_chains` — several chains in processes or on a Dask cluster, sharing their best;
* :func:`exhaustive` — every assignment of a small space, simulated;
* :func:`refine` — the search started from a planner's strategy, beside that strategy;
* :func:`descend`, :func:`search_and_descend` — the best improved one change at a time, and
  the chain and descent in turn within a time budget (what ``bench_quality`` runs).

The optimal keep/recompute schedule of a chain, which the search starts from and is checked
against, is a planner: :func:`memflow.planners.optimal_checkpointing`.

The names load on first use, so ``import memflow.search`` stays cheap.

>>> from memflow import search
>>> sorted(search.__all__)[:3]
['ChainsResult', 'ExhaustiveResult', 'MCMCSearch']
"""
from __future__ import annotations

from .._lazy import lazy_names

_EXPORTS = {
    "MCMCSearch": "memflow.search.mcmc",
    "run_chains": "memflow.search.parallel",
    "ChainsResult": "memflow.search.parallel",
    "exhaustive": "memflow.search.enumeration",
    "ExhaustiveResult": "memflow.search.enumeration",
    "baselines": "memflow.search.initial",
    "refine": "memflow.search.refinement",
    "descend": "memflow.search.descent",
    "search_and_descend": "memflow.search.descent",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_names("memflow.search", _EXPORTS)
