"""Memory of a training step: the memory model (``plan``) and the one-device estimate.

>>> from memflow.memory import CATEGORIES
>>> CATEGORIES
('weights', 'gradients', 'optimizer', 'activations', 'transient', 'communication')
"""
from .arrays import GraphArrays, graph_arrays
from .estimate import estimate
from .plan import CATEGORIES, OPTIMIZER_STATES, MemoryPlan, memory_plan

__all__ = ["estimate", "memory_plan", "MemoryPlan", "CATEGORIES", "OPTIMIZER_STATES",
           "graph_arrays", "GraphArrays"]
