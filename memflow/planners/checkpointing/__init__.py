"""Optimal checkpointing of a chain: the least-time keep/recompute schedule under a memory limit.

What is optimal, exactly. The schedules are those memflow can express and PyTorch runs: every
unit is kept or recomputed, and each maximal run of recomputed units is one checkpoint segment
(``torch.utils.checkpoint``). Among all ``2^n`` such assignments, :func:`optimal_checkpointing`
returns one of least compute time whose peak memory — in the simulator's own memory model,
block by block — stays within the limit; ``policies=("keep", "recompute", "offload")`` adds
offloading as a third choice per unit.

It applies to chains: graphs in which every tensor is used within a few units of its producer
(``MAX_SPAN``; one for a strict chain, two where in-place activations or views make a tensor
reach one unit further) and the model's outputs come from the last units
(:func:`chain_violation` says why a graph is not one).

Three parts, as rotor keeps them (Beaumont et al., "Optimal checkpointing for heterogeneous
chains"):

* :mod:`.chain` — the chain model: the numbers per unit the DP reads (:class:`ChainMemory`:
  each block's local peak and held bytes, probed from the simulator's memory model in every
  neighbourhood; forward and transfer times), in the program order of :mod:`.order`;
* :mod:`.solver` — the dynamic program over segmentations (:func:`solve`): its table of Pareto
  fronts, rotor's memory slots, and the reconstruction of a policy per unit;
* :mod:`.schedule` — :func:`optimal_checkpointing`: the DP's policies as a
  :class:`~memflow.Strategy`, simulated, in a :class:`CheckpointResult`.

>>> from memflow.search.synthetic import chain_graph
>>> res = optimal_checkpointing(chain_graph(6, batch=16384, width=64), "1xV100-16GB", 70e6)
>>> res.feasible, res.peak == res.predicted_peak, res.strategy.name
(True, True, 'optimal checkpointing')
"""
from .chain import MAX_SPAN, ChainMemory, chain_violation
from .schedule import CHECKPOINT, CheckpointResult, optimal_checkpointing
from .solver import solve

__all__ = ["optimal_checkpointing", "CheckpointResult", "CHECKPOINT", "chain_violation",
           "ChainMemory", "MAX_SPAN", "solve"]
