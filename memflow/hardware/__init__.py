"""Hardware: GPUs, hosts, switches and links as DataFrames; presets; routes; numpy views;
this machine's CPU measured (``Cluster.local()``); efficiencies with their sources
(``efficiency.EFFICIENCY``) and fitted to measured op times (:func:`calibrate`).

>>> from memflow.hardware import Cluster
>>> float(Cluster.preset("4xV100-16GB").devices["memory_bytes"].sum() / 2**30)
64.0
"""
from .._units import parse_bytes
from .arrays import ClusterArrays
from .calibration import calibrate
from .catalogue import EDGE_BOARDS, GPUS, LINK_KINDS
from .efficiency import EFFICIENCY
from .cluster import Cluster
from .limits import memory_limits
from . import presets as _presets  # noqa: F401  (attaches Cluster.preset, .presets, .build)
from . import local as _local  # noqa: F401  (attaches Cluster.local)

__all__ = ["Cluster", "ClusterArrays", "GPUS", "EDGE_BOARDS", "LINK_KINDS", "parse_bytes",
           "memory_limits", "calibrate", "EFFICIENCY"]
