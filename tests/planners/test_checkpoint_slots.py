"""Memory slots: the DP answers on a 100-unit chain in under a second, and its optimum is
the exact one within what ``n`` slots of memory can cost (in practice far closer)."""
import math
import time
from functools import lru_cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from search.helpers import V100

import memflow
from memflow.errors import SearchError
from memflow.planners import optimal_checkpointing
from memflow.planners.checkpointing.chain import KEEP_, REC_, ChainMemory, forward_times, span
from memflow.planners.checkpointing.solver import solve
from memflow.search.synthetic import chain_graph


@lru_cache(maxsize=None)
def dp_inputs(n: int, seed: int = 0, activation: str = "gelu", width: int = 256):
    """The chain model of ``chain_graph(n)``, its forward times, and keep-all's peak above
    the persistent bytes."""
    g = chain_graph(n, batch=16384, width=width, seed=seed, activation=activation)
    base = memflow.Strategy.single_device(g)
    sim = memflow.sim.Simulator(g, V100)
    chain = ChainMemory(sim, base, span(sim.ga)[0])
    keep = float(sim.evaluate(base).peak.max()) - chain.persistent
    return g, chain, forward_times(sim.run(base), n), [[KEEP_, REC_]] * n, keep


def test_a_hundred_unit_chain_solves_in_under_a_second():
    _, chain, fwd, allowed, keep = dp_inputs(100)
    solve(chain, fwd, allowed, 0.6 * keep, slots=500)          # compiles (or loads) the loops
    walls = []
    for _ in range(5):          # the best of five: a shared CI machine has other jobs
        start = time.perf_counter()
        T, P, types = solve(chain, fwd, allowed, 0.6 * keep, slots=500)
        walls.append(time.perf_counter() - start)
    assert min(walls) < 1.0, walls
    assert P <= 0.6 * keep and types.count(REC_) > 0 and T > 0


def test_slots_stay_close_to_the_exact_optimum_on_a_long_chain():
    # 36 units, where the exact fronts still answer in a fraction of a second
    _, chain, fwd, allowed, keep = dp_inputs(36)
    exact = solve(chain, fwd, allowed, 0.6 * keep)[0]
    assert exact <= solve(chain, fwd, allowed, 0.6 * keep, slots=500)[0] <= 1.01 * exact


@settings(max_examples=15, deadline=None)
@given(n=st.integers(3, 8), seed=st.integers(0, 5), q=st.floats(0.0, 1.0),
       activation=st.sampled_from(["gelu", "relu"]), slots=st.sampled_from([20, 100, 500]))
def test_slots_match_the_exact_optimum_within_n_slots(n, seed, q, activation, slots):
    """The slotted DP never beats the exact one, and is never worse than the exact optimum
    with the budget lowered by one slot per block."""
    _, chain, fwd, allowed, keep = dp_inputs(n, seed, activation, width=64)
    least = solve(chain, fwd, allowed, math.inf, least="memory")[1]
    budget = least + q * (keep - least)
    exact = solve(chain, fwd, allowed, budget)[0]
    slotted, peak, types = solve(chain, fwd, allowed, budget, slots=slots)
    assert slotted >= exact * (1 - 1e-12)
    assert slotted <= solve(chain, fwd, allowed, budget - n * budget / slots)[0] * (1 + 1e-12)
    if types is not None:
        assert peak <= budget
        assert slotted == pytest.approx(sum(fwd[u] for u, x in enumerate(types) if x == REC_))


@pytest.mark.parametrize("least", ["time", "memory"])
def test_a_slotted_schedule_is_what_the_simulator_says(least):
    g, chain, _, _, keep = dp_inputs(30)
    limit = chain.persistent + 0.5 * keep
    res = optimal_checkpointing(g, V100, limit, slots=500, least=least)
    assert res.peak == res.predicted_peak and res.time == pytest.approx(res.predicted_time)
    assert res.feasible and res.peak <= limit


def test_long_chains_get_slots_by_default():
    g, chain, _, _, keep = dp_inputs(100)
    start = time.process_time()
    res = optimal_checkpointing(g, V100, chain.persistent + 0.6 * keep)   # slots="auto"
    assert time.process_time() - start < 10          # the exact fronts take tens of seconds
    assert res.feasible and res.peak == res.predicted_peak and res.recomputed
    with pytest.raises(SearchError, match="slots=0; valid: a positive integer, None"):
        optimal_checkpointing(g, V100, slots=0)
