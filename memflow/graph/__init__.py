"""Capture of PyTorch models into an :class:`OpGraph` of units with memory numbers."""
from .opgraph import INPUT, OpGraph

__all__ = ["OpGraph", "INPUT"]
