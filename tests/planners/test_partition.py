"""The pipeline partition solvers against enumeration of every contiguous partition."""
import itertools

import numpy as np
import pytest

from memflow.planners.partition import (Chain, in_flight, period, solve_dp, solve_milp,
                                    stage_memory)


def enumerate_best(chain, limits, flight):
    """Smallest period over all partitions into len(limits) non-empty contiguous stages."""
    n, P = chain.n, len(limits)
    best = None
    for cuts in itertools.combinations(range(1, n), P - 1):
        stage = np.zeros(n, np.int64)
        for c in cuts:
            stage[c:] += 1
        if np.all(stage_memory(chain, stage, flight) <= limits):
            t = period(chain, stage)
            best = t if best is None else min(best, t)
    return best


def random_chain(rng, n):
    return Chain(time=rng.uniform(1, 10, n).round(1), weights=rng.integers(0, 5, n) * 1.0,
                 act=rng.integers(1, 6, n) * 1.0, tmp=rng.integers(0, 4, n) * 1.0,
                 cut=rng.uniform(0, 12, n - 1).round(1))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_milp_and_dp_reach_the_enumerated_optimum(seed, schedule):
    rng = np.random.default_rng(seed)
    n, P = 8, 3
    chain = random_chain(rng, n)
    flight = in_flight(P, 4, schedule)
    total = stage_memory(chain, np.zeros(n, np.int64), flight[:1])[0]
    limits = np.full(P, 0.55 * total)
    want = enumerate_best(chain, limits, flight)
    for got in (solve_milp(chain, limits, flight), solve_dp(chain, limits, flight)):
        if want is None:
            assert got is None
        else:
            stage, t = got
            assert t == pytest.approx(want)
            assert np.all(stage_memory(chain, stage, flight) <= limits + 1e-9)
            assert np.all(np.diff(stage) >= 0) and stage[0] == 0 and stage[-1] == P - 1


def test_hand_checked_case():
    # four equal units, two stages; 1F1B: stage 0 holds 2 micro-batches, stage 1 holds 1.
    chain = Chain(time=np.array([1.0, 1.0, 1.0, 1.0]), weights=np.zeros(4),
                  act=np.array([1.0, 1.0, 1.0, 1.0]), tmp=np.zeros(4), cut=np.zeros(3))
    flight = in_flight(2, 4, "1f1b")
    # stage 0 can hold one unit's activations only (2 in flight x 1 byte <= 2.5)
    limits = np.array([2.5, 10.0])
    for stage, t in (solve_milp(chain, limits, flight), solve_dp(chain, limits, flight)):
        assert stage.tolist() == [0, 1, 1, 1] and t == 3.0
    # a cut that costs more than any stage sets the period
    slow = Chain(chain.time, chain.weights, chain.act, chain.tmp, np.array([9.0, 0.5, 9.0]))
    for stage, t in (solve_milp(slow, np.full(2, 99.0), flight),
                     solve_dp(slow, np.full(2, 99.0), flight)):
        assert stage.tolist() == [0, 0, 1, 1] and t == 2.0
