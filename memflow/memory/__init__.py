"""Memory of a training step: the memory model (``blocks``) and the one-device estimate.

>>> from memflow.memory import CATEGORIES
>>> CATEGORIES
('weights', 'gradients', 'optimizer', 'activations', 'transient', 'communication')
"""
from .arrays import GraphArrays, graph_arrays
from .estimate import estimate
from .blocks import CATEGORIES, OPTIMIZER_STATES, StepBlocks, step_blocks

__all__ = ["estimate", "step_blocks", "StepBlocks", "CATEGORIES", "OPTIMIZER_STATES",
           "graph_arrays", "GraphArrays"]
