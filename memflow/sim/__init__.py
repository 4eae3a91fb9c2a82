"""The memory-aware execution simulator: strategies in, time and memory over time out.

>>> import pandas as pd, memflow
>>> from memflow.graph import OpGraph
>>> g = OpGraph(pd.DataFrame({"fwd_flops": [1e9, 1e9], "bwd_flops": [2e9, 2e9],
...                           "param_bytes": [4096, 4096], "trainable_bytes": [4096, 4096]},
...                          index=["a", "b"]),
...             pd.DataFrame({"bytes": [1000, 2000, 3000], "producer": ["<input>", "a", "b"],
...                           "consumers": [["a"], ["b"], []], "savers": [["a"], ["b"], []],
...                           "is_output": [False, False, True]}), {"batch_size": 8})
>>> r = simulate(g, memflow.Strategy.single_device(g), memflow.Cluster.preset("1xV100-16GB"))
>>> r.feasible, int(r.peak_memory["gpu0"])
(True, 18288)
"""
from __future__ import annotations

from ..strategy import Strategy
from .estimate import estimate
from .evaluator import Evaluator, Outcome
from .kinds import (K_ALLRED, K_BWD, K_COMPRESS, K_DECOMP, K_FWD, K_OFFLOAD, K_OPT, K_PREFETCH,
                    K_RECOMP, K_XFER, R_COMM, R_COMPUTE, R_COPY, R_COPYBACK, R_D2H, R_H2D, ROLES,
                    TASK_KINDS)
from .result import SimResult
from .simulator import Evaluation, Simulator

__all__ = ["simulate", "estimate", "SimResult", "Simulator", "Evaluation", "Evaluator", "Outcome",
           "TASK_KINDS", "ROLES",
           "K_FWD", "K_BWD", "K_RECOMP", "K_XFER", "K_ALLRED", "K_OFFLOAD", "K_PREFETCH",
           "K_COMPRESS", "K_DECOMP", "K_OPT",
           "R_COMPUTE", "R_COMM", "R_D2H", "R_H2D", "R_COPY", "R_COPYBACK"]


def simulate(graph, strategy: Strategy, cluster, *, optimizer: str = "sgd",
             precision: str | None = None, fold: bool = True) -> SimResult:
    """Simulate one training step of ``strategy`` for ``graph`` on ``cluster``.

    ``optimizer`` is one of :data:`memflow.strategy.OPTIMIZERS` (``"sgd"``, ``"momentum"``,
    ``"adam"``, ``"adam8bit"``); ``precision`` one of :data:`memflow.strategy.PRECISIONS`, the
    default for strategies that set none (default: ``"amp"`` if the graph was captured under
    autocast, else ``"fp32"``). ``fold=False`` simulates every replica
    separately (same result, slower; for checking). The strategy is validated first.
    """
    strategy.validate(graph, cluster)
    return Simulator(graph, cluster, optimizer=optimizer, precision=precision).result(
        strategy, fold=fold)
