"""Strategies: per unit a parallel configuration and a memory policy (see ``docs/data-model.md``).

>>> from memflow.strategy import Strategy
>>> Strategy(["a"], devices=[("gpu0",)]).policies
['keep']
"""
from . import constructors as _constructors  # noqa: F401  (attaches the constructors)
from .constructors import (balanced_split, data_parallel, device_list, hybrid, model_parallel,
                           pipeline, single_device, tensor_parallel)
from .policies import (COMPRESS, KEEP, MECHANISMS, OFFLOAD, POLICIES, RECOMPUTE, SELECTIVE, Policy,
                       PolicyTable, parse_policy)
from .shard_levels import OPTIMIZERS, PRECISIONS, SHARD_LEVELS
from .strategy import SCHEDULES, Strategy
from . import model_states as _model_states  # noqa: F401  (attaches with_shard, with_model_states)
from . import document as _document  # noqa: F401  (attaches to_dict, from_dict, to_json, from_json)
from .validate import validate

__all__ = ["Strategy", "Policy", "PolicyTable", "POLICIES", "MECHANISMS", "SCHEDULES", "SHARD_LEVELS", "PRECISIONS", "OPTIMIZERS", "KEEP", "RECOMPUTE", "OFFLOAD", "COMPRESS", "SELECTIVE",
           "parse_policy", "validate", "device_list", "balanced_split", "single_device",
           "data_parallel", "model_parallel", "hybrid", "pipeline", "tensor_parallel"]
