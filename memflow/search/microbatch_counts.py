"""The micro-batch move's choices: how many micro-batches each replica's batch splits into.

With one stage, micro-batches are gradient accumulation: each replica runs its batch in
``m`` equal parts, forward and backward one after the other, and steps once; the
activations held at a time shrink about ``m``-fold for a little more time per step
(smaller kernels, ``m`` launches). On resnet50 at batch 1,024 on 4×V100-16GB two
micro-batches fit without recomputing anything and beat the optimal checkpointing schedule
(``benchmarks/bench_quality.py``); no per-unit move reaches it. In a pipeline the count sets
the bubble and the activations in flight, as the pipeline planner's choice does.

Counts are those that split every unit's share of the batch evenly (export cuts the batch
into equal micro-batches) — the divisors of ``batch / sample`` for the largest sample degree;
a move goes to the next count up or down, as the time and the memory change most smoothly
there (a jump from 1 to 64 on resnet50 costs far more than it saves, and the chain would
refuse nearly every such proposal).
"""
from __future__ import annotations

import numpy as np

from ..strategy import Strategy
from .space import SearchSpace

__all__ = ["microbatch_choices", "with_microbatches"]


def microbatch_choices(s: Strategy, space: SearchSpace) -> list[int]:
    """The micro-batch counts next to ``s``'s (one below, one above) among those that split
    every replica's batch evenly.

    >>> import memflow
    >>> from memflow.search.synthetic import chain_graph
    >>> g = chain_graph(2, batch=32)
    >>> sp = SearchSpace(g, memflow.Cluster.preset("4xV100-16GB"))
    >>> s = memflow.Strategy.data_parallel(g, 4)
    >>> microbatch_choices(s, sp), microbatch_choices(s.with_schedule(microbatches=2), sp)
    ([2], [1, 4])
    """
    if not space.batch:
        return []           # a graph that records no batch: nothing to split
    samples = np.unique(np.asarray(s.sample, np.int64))
    if (space.batch % samples).any():
        return []
    share = space.batch // int(samples.max())
    counts = [m for m in range(1, share + 1)
              if share % m == 0 and all(space.batch % (int(d) * m) == 0 for d in samples)]
    below = [m for m in counts if m < s.microbatches]
    above = [m for m in counts if m > s.microbatches]
    return below[-1:] + above[:1]


def with_microbatches(s: Strategy, m: int, space: SearchSpace) -> Strategy:
    """``s`` with ``m`` micro-batches, on a schedule export runs where the space is export's
    (:meth:`~memflow.search.space.SearchSpace.on_exported_schedule`)."""
    return space.on_exported_schedule(s.with_schedule(microbatches=m))
