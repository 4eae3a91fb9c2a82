"""Memory of a training step: the memory model (``blocks``: what holds each storage, when).

The one-device estimate, which replays this model through the simulator's tasks and ledger,
is :func:`memflow.estimate` (in :mod:`memflow.sim.estimate`).

>>> from memflow.memory import CATEGORIES
>>> CATEGORIES
('weights', 'gradients', 'optimizer', 'activations', 'transient', 'communication')
"""
from .arrays import GraphArrays, graph_arrays
from .blocks import CATEGORIES, OPTIMIZER_STATES, StepBlocks, step_blocks

__all__ = ["step_blocks", "StepBlocks", "CATEGORIES", "OPTIMIZER_STATES",
           "graph_arrays", "GraphArrays"]
