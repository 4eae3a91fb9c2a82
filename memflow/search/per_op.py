"""The per-op move's choices: the per-operation planner's keep/selective plans, as the search
proposes them.

:func:`~memflow.planners.selective.selective_plan` picks, per unit of a graph, keep or
selective under a budget of bytes held for backward; on a graph of leaf units (a unit per
Linear, GELU, LayerNorm…) that is a save-or-recompute choice per operation, the one
PyTorch's min-cut partitioner makes. The search cannot afford an integer program per step, so
each graph's plans at :data:`PER_OP_BUDGETS` are solved once, when a move first asks (with
at most :data:`PER_OP_NODES` branch-and-bound nodes), and a
move copies one plan's choices onto a run of units: the plan at the budget nearest the share
of its saved bytes the run holds now, a step down or up. Export writes ``selective`` as a
selective checkpoint policy (``create_selective_checkpoint_contexts``), so the choices stay in
export's space.
"""
from __future__ import annotations

import weakref

import numpy as np

from ..memory.arrays import graph_arrays
from ..planners.common import Infeasible
from ..planners.selective import selective_plan
from ..strategy import POLICIES, Strategy
from ..strategy.policies import KEEP, SELECTIVE
from .space import SearchSpace

__all__ = ["PER_OP_BUDGETS", "per_op_choices", "solve_plans"]

PER_OP_BUDGETS = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
"""The planner's budgets, fractions of what keeping everything holds."""
PER_OP_NODES = 200
"""Branch-and-bound nodes per plan: resnet50's 175 leaf units at 0.9 took 28 CPU s exactly,
under 0.4 s with this limit (plans within 1% or the best found)."""
RUN_MAX = 8         # units a run takes from the plan, when it is not every free unit

_PLANS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()      # graph -> its plans


def _plans(graph) -> dict:
    """The planner cache of ``graph``: per budget, whether each unit is selective in the plan
    (None: no plan holds so little); under ``"held"``, per unit, its saved bytes when kept
    and its expensive ops' outputs (what it holds when selective)."""
    plans = _PLANS.get(graph)
    if plans is None:
        ga = graph_arrays(graph)
        made = (ga.producer >= 0) & ga.expensive
        plans = _PLANS[graph] = {"held": (
            graph.units["saved_bytes"].to_numpy(np.float64),
            np.bincount(ga.producer[made], ga.bytes[made], minlength=len(ga.names)))}
    return plans


def _plan(graph, budget: float) -> np.ndarray | None:
    plans = _plans(graph)
    if budget not in plans:
        try:
            plans[budget] = POLICIES.selective(
                selective_plan(graph, budget, node_limit=PER_OP_NODES).policy)
        except Infeasible:
            plans[budget] = None
    return plans[budget]


def solve_plans(graph) -> int:
    """Solve every plan of ``graph`` now (they are kept per graph, for every search of it),
    not at the moves that first ask; how many exist (a budget may have none). A benchmark of
    steady proposal rates counts this one-time cost apart.

    >>> from memflow.search.synthetic import chain_graph
    >>> solve_plans(chain_graph(3)) <= len(PER_OP_BUDGETS)
    True
    """
    return sum(_plan(graph, b) is not None for b in PER_OP_BUDGETS)


def per_op_choices(rng: np.random.Generator, s: Strategy,
                   space: SearchSpace) -> dict[str, str] | None:
    """Policies (unit -> keep/selective) that a run of free units takes from a plan: 1–8
    units from a random one, or every free unit one time in four; the plan at the budget
    nearest the share of the run's saved bytes it holds now (kept units all, selective ones
    their expensive ops' outputs), a step down, the same or a step up, or the least budget
    above that some plan meets. ``selective`` goes only where the unit recomputes and, in
    the runnable space, replays. None when the space lacks keep or selective, or the plan
    changes nothing there.

    >>> import memflow, torch
    >>> from torch import nn
    >>> block = lambda: nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.LayerNorm(64))
    >>> g = memflow.from_torch(nn.Sequential(block(), block()), torch.randn(8, 64))
    >>> sp = SearchSpace(g, memflow.Cluster.preset("1xV100-16GB"))
    >>> per_op_choices(np.random.default_rng(3), memflow.Strategy.single_device(g), sp)
    {'0.1': 'selective', '0.2': 'selective', '1.0': 'selective'}
    """
    if "selective" not in space.policies or space.keep is None:
        return None
    free = space.free()
    if not len(free):
        return None
    lo = int(free[int(rng.integers(len(free)))])
    run = free[free >= lo][:int(rng.integers(1, RUN_MAX + 1))] if rng.integers(4) else free
    saved, expensive = (a[run] for a in _plans(space.graph)["held"])
    policy = s.policy[run]
    held = np.where(policy == KEEP, saved, 0.0) + np.where(policy == SELECTIVE, expensive, 0.0)
    share = float(held.sum()) / max(float(saved.sum()), 1.0)
    near = int(np.abs(np.asarray(PER_OP_BUDGETS) - share).argmin()) + int(rng.integers(-1, 2))
    plan = next((p for p in (_plan(space.graph, b) for b in PER_OP_BUDGETS[max(near, 0):])
                 if p is not None), None)
    if plan is None:
        return None
    may = space.recomputable & space.replays
    want = np.where(plan[run] & may[run], SELECTIVE, KEEP)
    moved = want != policy
    if not moved.any():
        return None
    return {space.names[j]: POLICIES[c] for j, c in zip(run[moved], want[moved])}
