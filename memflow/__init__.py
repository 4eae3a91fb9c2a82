"""memflow: plan how to train deep networks when GPU memory is the limit.

Capture a PyTorch model as a graph of units with memory estimates, simulate a training step on
every GPU of a cluster (time and memory over time), search by MCMC for the placement, split and
per-unit memory policy (keep, recompute, selective, offload, compress) that fits and runs
fastest, and export the result as PyTorch training code.

>>> import memflow
>>> g = memflow.zoo.graph("mlp", batch_size=8)
>>> cluster = memflow.Cluster.preset("1xV100-16GB")
>>> result = memflow.simulate(g, memflow.Strategy.single_device(g), cluster)
>>> bool(result.feasible)
True

Memory policies live in one table, ``memflow.POLICIES`` (see ``docs/architecture.md``):

>>> list(memflow.POLICIES), memflow.POLICIES["offload"].mechanism
(['keep', 'recompute', 'offload', 'compress', 'selective'], 'host')

Step times come from datasheet peaks and a table of sourced efficiencies
(``memflow.hardware.EFFICIENCY``), from this machine's CPU measured by a short micro-benchmark
(``memflow.Cluster.local()``, cached; ``remeasure=True`` measures again), or from measured op
times (``memflow.hardware.calibrate``); each device says which, and
``memflow.export.validate(..., time=True)`` compares a prediction with the exported script's
real step time:

>>> cluster.devices["figures"].tolist(), cluster.figures_note()
(['datasheet'], 'V100-16GB: datasheet (peaks from the vendor, efficiencies from the sourced table)')

The names below load on first use, so ``import memflow`` stays fast.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_names

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "OpGraph": "memflow.graph",
    "from_torch": "memflow.graph.capture",
    "Cluster": "memflow.hardware",
    "estimate": "memflow.sim",
    "Strategy": "memflow.strategy",
    "Policy": "memflow.strategy",
    "POLICIES": "memflow.strategy",
    "simulate": "memflow.sim",
    "Evaluator": "memflow.sim",
    "SimResult": "memflow.sim",
    "MCMCSearch": "memflow.search",
}
_SUBMODULES = ("graph", "hardware", "memory", "strategy", "sim", "search", "planners", "export",
               "report", "zoo", "compress", "errors", "cli")

__all__ = sorted(_EXPORTS) + list(_SUBMODULES)

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from .graph import OpGraph
    from .graph.capture import from_torch
    from .hardware import Cluster
    from .search import MCMCSearch
    from .sim import Evaluator, SimResult, estimate, simulate
    from .strategy import POLICIES, Policy, Strategy


__getattr__, __dir__ = lazy_names("memflow", _EXPORTS, _SUBMODULES)
