"""Exceptions memflow raises for bad input.

Every error names the thing at fault (unit, device, field, file) and says what would be valid,
so a person can fix the input without reading memflow's code.
"""
from __future__ import annotations

__all__ = [
    "MemflowError",
    "CaptureError",
    "GraphError",
    "ClusterError",
    "StrategyError",
    "SimulationError",
    "SearchError",
    "ExportError",
    "PlanError",
    "CompressionError",
    "FileFormatError",
]


class MemflowError(ValueError):
    """Base class: invalid input to memflow (a ``ValueError``)."""


class CaptureError(MemflowError):
    """The model could not be captured (a forward raised, or the inputs are unusable)."""


class GraphError(MemflowError):
    """An OpGraph's tables are inconsistent (unknown unit, negative bytes, bad order)."""


class ClusterError(MemflowError):
    """A cluster description is invalid (unknown preset, negative memory, unknown link kind)."""


class StrategyError(MemflowError):
    """A strategy does not fit its graph or cluster (unknown unit or device, bad degree)."""


class SimulationError(MemflowError):
    """A simulation was asked for something it cannot model."""


class SearchError(MemflowError):
    """A search was configured or resumed with inconsistent input."""


class ExportError(MemflowError):
    """A strategy cannot be expressed as PyTorch code."""


class PlanError(MemflowError):
    """A planner was given input it cannot plan for."""


class CompressionError(MemflowError):
    """A tensor or an error bound cannot be compressed as asked."""


class FileFormatError(MemflowError):
    """A saved file is corrupt, of another kind, or of an unknown format version."""
