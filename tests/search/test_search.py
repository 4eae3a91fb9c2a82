"""MCMCSearch basics: costs, bests, budgets, memory-oblivious mode, baselines, errors."""
import math

import numpy as np
import pytest

import memflow
from memflow.errors import SearchError, StrategyError
from memflow.hardware import memory_limits
from memflow.search import MCMCSearch
from memflow.search.cost import JUMP, CostModel
from memflow.sim import Simulator

from .helpers import FOUR, V100, chain


def test_exported_from_memflow():
    assert memflow.MCMCSearch is MCMCSearch


def test_infeasible_costs_more_than_its_time_and_is_never_best():
    g = chain(6)
    search = MCMCSearch(g, V100, memory_limit=1.0)       # nothing fits
    search.step(30)
    h = search.history
    assert (h["cost"] > h["time"]).all() and not h["feasible"].any()
    assert math.isinf(search.best_cost) and not search.best_score.feasible


def test_memory_oblivious_ignores_the_limit():
    search = MCMCSearch(chain(6), FOUR, memory_limit=1.0, memory_aware=False)
    search.step(40)
    h = search.history
    assert (h["cost"] == h["time"]).all()
    assert search.best_cost <= h["cost"].min() and not search.best_score.feasible
    assert set(h["move"]) <= {"config", "copy", "swap"}


def test_finds_a_feasible_strategy_on_four_gpus():
    g = chain(8, batch=65536)
    keep = memflow.simulate(g, memflow.Strategy.data_parallel(g, FOUR), FOUR)
    limit = 0.75 * keep.peak_memory.max()
    search = MCMCSearch(g, FOUR, memory_limit=limit, seed=3)
    search.run(iterations=400, callback=lambda s: math.isinf(s.best_cost))
    assert search.best_score.feasible
    result = search.best_result
    assert result.peak_memory.max() <= limit and result.strategy is search.best
    search.best.validate(g, FOUR)


def test_run_budgets_and_callback():
    search = MCMCSearch(chain(5), V100, memory_limit=40e6)
    search.run(iterations=7)
    search.run(callback=lambda s: s.iteration < 10)
    search.run(seconds=0.05)
    h = search.history
    assert h["iteration"].tolist() == list(range(len(h))) and len(h) >= 10
    assert 0.0 <= search.acceptance_rate(5) <= 1.0 and search.elapsed > 0
    assert h["elapsed"].is_monotonic_increasing
    with pytest.raises(SearchError, match="run needs a budget"):
        search.run()


def test_baseline_start_is_the_best_baseline():
    g = chain(5, batch=65536)
    search = MCMCSearch(g, FOUR, init="baseline", memory_limit=60e6)
    first = search.current
    names = memflow.search.baselines(g, FOUR, memory_limit=60e6)
    costs = {k: search._cost(v).cost for k, v in names.items()}
    assert search._cost(first).cost == min(costs.values())


def test_from_every_baseline_the_search_ends_no_worse():
    """Started from each planner's strategy, the reported best is never worse than the start:
    feasible before infeasible, then a lower cost."""
    g = chain(5, batch=65536)
    for name, start in memflow.search.baselines(g, FOUR, memory_limit=60e6).items():
        search = MCMCSearch(g, FOUR, init=start, memory_limit=60e6, seed=0)
        first = search.best_score
        end = search.run(iterations=40).best_score
        assert (not end.feasible, end.cost) <= (not first.feasible, first.cost), name


def test_given_strategy_is_validated():
    g = chain(3)
    bad = memflow.Strategy.single_device(g, "gpu9")
    with pytest.raises(StrategyError, match="gpu9"):
        MCMCSearch(g, V100, init=bad)


@pytest.mark.parametrize("kwargs, match", [
    ({"init": "random"}, "init='random' is unknown"),
    ({"moves": {"teleport": 1.0}}, "unknown move 'teleport'"),
    ({"moves": {"policy": 0.0}}, "not all 0"),
    ({"beta": 0}, "beta must be > 0"),
    ({"policies": ("keep", "swap")}, "'swap' is not a memory policy"),
    ({"memory_limit": "lots"}, "cannot read a size"),
])
def test_bad_settings_say_what_is_valid(kwargs, match):
    with pytest.raises(memflow.errors.MemflowError, match=match):
        MCMCSearch(chain(3), V100, **kwargs)


def test_cost_model_memoizes_and_limits_per_device():
    g = chain(4)
    cm = CostModel(Simulator(g, FOUR), memory_limit={"gpu1": "1GB"})
    s = memflow.Strategy.single_device(g)
    assert cm(s) is cm(s) and cm.simulations == 1
    assert memory_limits(FOUR, {"gpu1": "1GB"})[1] == 1e9
    sc = cm.score(1.0, np.array([0.0, 2e9, 0.0, 0.0]))
    assert not sc.feasible and sc.cost == pytest.approx(1.0 + 0.05 + 4.0 * 1.0)


def test_offloading_past_a_host_is_infeasible_as_for_the_planners():
    # an edge board's host is the GPU's own memory: nothing can be offloaded into it
    g = chain(4)
    jetson = memflow.Cluster.preset("jetson-nano-4GB")
    s = memflow.Strategy.single_device(g).with_policy(offload=["l1"])
    score = CostModel(Simulator(g, jetson))(s)
    assert not score.feasible and score.cost == pytest.approx((1 + JUMP) * score.time)
    assert not Simulator(g, jetson).evaluate(s).feasible
