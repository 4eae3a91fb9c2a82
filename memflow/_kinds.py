"""Module kinds that more than one layer names: declared once, below them all.

A unit's ``kind`` is its module's class name (``torch.nn`` or the model's own). The graph
layer turns these names into classes (:data:`memflow.graph.slicing.NORMS`); the strategy layer
matches them against the units table (:mod:`memflow.strategy.sequence_parallel`).

>>> NORM_KINDS
('LayerNorm', 'RMSNorm', 'GroupNorm')
"""
from __future__ import annotations

__all__ = ["NORM_KINDS"]

NORM_KINDS = ("LayerNorm", "RMSNorm", "GroupNorm")
"""The ``torch.nn`` normalizations a tensor split runs whole on every rank (their weights are a
vector; sharding their features would need the statistics all-reduced), and as
``SequenceParallel`` under sequence parallelism (:mod:`memflow.export.tensor_parallel`)."""
