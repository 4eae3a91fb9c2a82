"""Strategies: per unit a parallel configuration and a memory policy (see ``docs/data-model.md``).

>>> from memflow.strategy import Strategy
>>> Strategy(["a"], devices=[("gpu0",)]).policies
['keep']
"""
from . import constructors as _constructors  # noqa: F401  (attaches the constructors)
from .constructors import (balanced_split, data_parallel, device_list, hybrid, model_parallel,
                           pipeline, single_device, tensor_parallel)
from .strategy import (COMPRESS, KEEP, OFFLOAD, POLICIES, RECOMPUTE, SCHEDULES, Strategy,
                       parse_policy)
from .validate import validate

__all__ = ["Strategy", "POLICIES", "SCHEDULES", "KEEP", "RECOMPUTE", "OFFLOAD", "COMPRESS",
           "parse_policy", "validate", "device_list", "balanced_split", "single_device",
           "data_parallel", "model_parallel", "hybrid", "pipeline", "tensor_parallel"]
