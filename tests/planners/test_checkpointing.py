"""optimal_checkpointing is exact: it matches exhaustive enumeration through the simulator."""
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from search.helpers import FOUR, V100, chain, every_schedule, keep_all_peak, optimum
from sim.graphs import graphs   # the simulator's random graphs (tests/sim/graphs.py)

import memflow
from memflow.errors import SearchError
from memflow.planners import chain_violation, optimal_checkpointing
from memflow.search import exhaustive
from memflow.search.synthetic import chain_graph
from memflow.strategy import Strategy


@pytest.mark.parametrize("n, seed, activation", [(6, 0, "gelu"), (7, 1, "relu"), (8, 2, "gelu")])
def test_matches_exhaustive_at_every_limit(n, seed, activation):
    table = every_schedule(n, seed, activation)
    peaks = np.unique(table["peak"])
    for limit in np.quantile(peaks, [0.0, 0.15, 0.35, 0.5, 0.7, 0.9, 1.0]):
        res = optimal_checkpointing(chain(n, seed, activation), V100, limit)
        assert res.time == pytest.approx(optimum(table, limit), rel=1e-12)
        # what the DP predicts is what the simulator says
        assert res.peak == res.predicted_peak
        assert res.time == pytest.approx(res.predicted_time, rel=1e-12)
        assert res.feasible and res.peak <= limit


@pytest.mark.parametrize("seed", [1, 3])
def test_offload_as_a_third_choice_matches_exhaustive(seed):
    """On a K80 (slow compute, PCIe transfers) offloading pays at tight limits (on chain 2 it
    no longer does since the model's output is freed after the loss: recomputing suffices)."""
    k80 = memflow.Cluster.preset("1xK80")
    g = chain_graph(5, seed=seed, batch=4096, width=512)
    three = ("keep", "recompute", "offload")
    table = exhaustive(g, k80, policies=three).table
    offloaded = set()
    for q in (0.0, 0.2, 0.6):
        limit = float(np.quantile(np.unique(table["peak"]), q))
        res = optimal_checkpointing(g, k80, limit, policies=three)
        assert res.time == pytest.approx(optimum(table, limit), rel=1e-12)
        assert res.peak == res.predicted_peak and res.time == pytest.approx(res.predicted_time)
        offloaded |= set(res.offloaded)
    assert offloaded and res.strategy.policies.count("offload") == len(res.offloaded)


def test_below_every_schedule_is_a_clear_error():
    table = every_schedule(6)
    with pytest.raises(SearchError, match="no keep/recompute schedule .* fits memory_limit"):
        optimal_checkpointing(chain(6), V100, 0.99 * table["peak"].min())


@pytest.mark.parametrize("n, seed", [(6, 0), (8, 2)])
def test_least_memory_matches_exhaustive(n, seed):
    """``least="memory"``: the least peak of all 2^n schedules, and the fastest at it, whatever
    the limit (here far below it)."""
    table = every_schedule(n, seed)
    low = float(table["peak"].min())
    res = optimal_checkpointing(chain(n, seed), V100, 0.5 * low, least="memory")
    assert res.peak == res.predicted_peak == low and not res.feasible
    assert res.time == pytest.approx(optimum(table, low), rel=1e-12)
    with pytest.raises(SearchError, match="least='most'; valid: time, memory"):
        optimal_checkpointing(chain(n, seed), V100, least="most")


def test_keep_all_when_memory_is_plenty():
    res = optimal_checkpointing(chain(6), V100)
    assert res.recomputed == () and res.strategy.policies == ["keep"] * 6


def test_slots_only_lose_schedules():
    table = every_schedule(8, 2)
    limit = 0.8 * keep_all_peak(table)
    exact = optimal_checkpointing(chain(8, 2), V100, limit)
    coarse = optimal_checkpointing(chain(8, 2), V100, limit, slots=4)
    assert coarse.feasible and coarse.time >= exact.time


def test_data_parallel_base_memory_is_exact():
    g = chain(10, batch=65536)
    base = Strategy.data_parallel(g, FOUR)
    keep = memflow.simulate(g, base, FOUR).peak_memory.max()
    res = optimal_checkpointing(g, FOUR, 0.7 * keep, base=base)
    assert res.peak == res.predicted_peak <= 0.7 * keep
    assert res.strategy.devices == base.devices and "optimal checkpointing" in res.strategy.name


def test_too_long_a_reach_names_the_tensor():
    g = chain(8)
    t = g.tensors.drop(columns=["first_saver", "last_consumer"])
    t.at[2, "consumers"] = ["l1", "l7"]          # a skip connection over six units
    skip = memflow.graph.OpGraph(g.units.drop(columns=["input_bytes", "output_bytes",
                                                       "saved_bytes"]), t, g.meta)
    assert chain_violation(skip) == "tensor 2 from l0 is used 7 units later, by l7"
    with pytest.raises(SearchError, match="needs a chain: tensor 2 from l0 is used 7 units"):
        optimal_checkpointing(skip, V100)


@settings(max_examples=10)
@given(g=graphs(max_units=6), q=st.floats(0, 1), optimizer=st.sampled_from(["sgd", "adam"]))
def test_exact_on_graphs_with_short_skips(g, q, optimizer):
    """Random graphs with skip connections, shared savers and temporaries (the simulator's
    own test generator): wherever the DP applies it finds the exhaustive optimum."""
    assume(chain_violation(g) is None)
    table = exhaustive(g, V100, optimizer=optimizer).table
    limit = float(np.quantile(np.unique(table["peak"]), q))
    res = optimal_checkpointing(g, V100, limit, optimizer=optimizer)
    assert res.time == pytest.approx(optimum(table, limit), rel=1e-9)
    assert res.peak == res.predicted_peak <= limit


def test_rejects_several_placements():
    g = chain(4)
    with pytest.raises(SearchError, match="one placement for every unit"):
        optimal_checkpointing(g, FOUR, base=Strategy.model_parallel(g, FOUR))
