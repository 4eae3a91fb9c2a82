"""Capture of PyTorch models into an :class:`OpGraph` of units with memory numbers.

* :mod:`~memflow.graph.opgraph` — the :class:`OpGraph` container (``docs/data-model.md``);
* :mod:`~memflow.graph.parameters` — its ``parameters`` table (weights and buffers once each,
  with the unit that owns them and the units that read them);
* :mod:`~memflow.graph.capture` — :func:`memflow.from_torch`, one training step on fake tensors;
* :mod:`~memflow.graph.units` — which modules become units (leaves, blocks, depth, list);
* :mod:`~memflow.graph.recorder` — the dispatch mode and hooks that record a step;
* :mod:`~memflow.graph.opcost` — FLOPs, bytes and kernels of each aten op;
* :mod:`~memflow.graph.mapkind` — what kind of values each feature map holds (signed,
  normalized, rectified, probabilities), for its compression ratio;
* :mod:`~memflow.graph.selective` — the expensive ops whose outputs selective recomputation
  keeps;
* :mod:`~memflow.graph.backend` and :mod:`~memflow.graph.autocast` — device rules for what
  autograd saves, and mixed precision (also capture's amp pass, ``OpGraph.amp``: the step as
  the ``amp`` precision runs it under float16 autocast);
* :mod:`~memflow.graph.compute` — what a bf16 strategy casts, the rule capture's bf16 pass
  (``OpGraph.bf16``) and the exported script share;
* :mod:`~memflow.graph.tables` — the ``units``, ``tensors`` and ``parameters`` tables of a
  capture and their heuristics;
* :mod:`~memflow.graph.measure` — what real autograd saves, the yardstick capture is tested on.
"""
from .opgraph import INPUT, OpGraph

__all__ = ["OpGraph", "INPUT"]
