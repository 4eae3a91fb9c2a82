"""Checkpointing planners on hand-checked chains."""
import math

import pytest

import memflow
from memflow.errors import PlanError
from memflow.planners import Infeasible, checkpoint, checkpoint_table
from memflow.planners.checkpoint import chen_checkpoints, revolve_snapshots

from .graphs import GIB, chain


def marks(strategy):
    return "".join("K" if p == "keep" else "r" for p in strategy.policies)


def test_chen_greedy_by_hand():
    # running sums 3, 3+1 > 3 -> cut at 1; then 2, 2+2 > 3 -> cut at 3; then 5 > 3 -> cut at 4
    assert chen_checkpoints([3, 1, 2, 2, 5], 3).tolist() == [1, 3, 4]
    assert chen_checkpoints([1, 1, 1], 10).tolist() == []


def test_revolve_snapshots_are_binomial():
    # 2 snapshots, 10 steps: r = 3 repetitions cover C(5, 2) = 10 steps; revolve advances
    # bino1 = 10 * 3 / 5 = 6 steps before the second snapshot
    assert revolve_snapshots(10, 2) == [0, 6]
    assert revolve_snapshots(4, 4) == [0, 1, 2, 3]
    for steps, snaps in ((30, 3), (30, 6), (100, 5)):
        pos = revolve_snapshots(steps, snaps)
        assert pos[0] == 0 and len(pos) <= snaps and pos == sorted(set(pos))
        assert pos[-1] < steps
    with pytest.raises(PlanError):
        revolve_snapshots(0, 1)


def test_methods_on_a_uniform_chain():
    g = chain(9)
    # keep all: 9 GiB of saved inputs + the output; sqrt fits 8 GiB with three segments
    s = checkpoint(g, "1xV100-16GB", "8GiB", method="sqrt")
    assert marks(s) == "rrKrrKrrK"
    r = memflow.simulate(g, s, memflow.Cluster.preset("1xV100-16GB"))
    assert r.feasible and r.peak_memory.max() <= 8 * GIB
    assert marks(checkpoint(g, "1xV100-16GB", method="all")) == "r" * 9
    # with room for everything, revolve keeps every unit (no recomputation at all)
    assert marks(checkpoint(g, "1xV100-16GB", "15GiB", method="revolve")) == "K" * 9


def test_table_reports_smallest_memory_and_cost():
    g = chain(9)
    t = checkpoint_table(g, "jetson-nano-4GB", ["sqrt", "revolve", "all"])
    keep = t.loc["keep all"]
    assert keep["min_memory"] == pytest.approx(9 * GIB, rel=0.01) and not keep["fits"]
    for m in ("sqrt", "revolve"):
        assert t.loc[m, "min_memory"] < 0.8 * keep["min_memory"]
        assert 0 < t.loc[m, "overhead_at_min"] < 0.5     # one extra forward at most: 1/3
    # recomputing everything as one segment saves nothing at the peak
    assert t.loc["all", "min_memory"] >= keep["min_memory"]
    assert not t.loc["all", "fits"] and math.isnan(t.loc["all", "time"])


def test_below_any_strategy_says_so():
    g = chain(9)
    with pytest.raises(Infeasible) as err:
        checkpoint(g, "1xV100-16GB", "1GiB", method="sqrt")
    assert err.value.min_memory > GIB and err.value.best is not None
    assert "smallest peak found" in str(err.value) and isinstance(err.value, PlanError)


@pytest.mark.parametrize("method", ["optimal", "sqrt", "revolve", "all"])
def test_does_not_fit_is_infeasible_even_above_capacity(method):
    """Keeping everything (9 GiB) is over the board's capacity (3 GiB): every method says
    Infeasible with the least memory it reaches and the strategy reaching it (issue 16)."""
    g = chain(9)
    table = checkpoint_table(g, "jetson-nano-4GB", [method])
    with pytest.raises(Infeasible) as err:
        checkpoint(g, "jetson-nano-4GB", method=method)
    low = table.loc[method, "min_memory"]
    assert err.value.min_memory == low > 3 * GIB and err.value.method == method
    peak = memflow.simulate(g, err.value.best, memflow.Cluster.preset("jetson-nano-4GB")
                            ).peak_memory.max()
    assert peak == low


def test_inputs_are_checked():
    g = chain(3)
    with pytest.raises(PlanError, match="unknown method 'best'.*valid: optimal, sqrt"):
        checkpoint(g, "1xV100-16GB", method="best")
    with pytest.raises(PlanError, match="memory_limit must be a positive"):
        checkpoint(g, "1xV100-16GB", "-2GiB")
    with pytest.raises(PlanError, match="preset name"):
        checkpoint(g, 16, "2GiB")
    with pytest.raises(PlanError, match="OpGraph"):
        checkpoint("resnet50", "1xV100-16GB")


def test_non_recomputable_units_stay_kept():
    g = chain(6)
    g.units["recomputable"] = [True, True, False, True, True, True]
    s = checkpoint(g, "1xV100-16GB", method="all")
    assert s.policies[2] == "keep"


def test_optimal_beats_or_matches_the_heuristics_on_chains_only():
    g = chain(9)
    t = checkpoint_table(g, "1xV100-16GB", ["optimal", "sqrt"], memory_limit="8GiB")
    assert t.loc["optimal", "fits"]
    assert t.loc["optimal", "time"] <= t.loc["sqrt", "time"] * 1.0001
    assert t.loc["optimal", "min_memory"] <= t.loc["sqrt", "min_memory"] * 1.01
    # a long skip connection makes the graph a non-chain: optimal says so, the others run
    skip = chain(8)
    skip.tensors.at[1, "consumers"] = ["u1", "u7"]
    skip = memflow.graph.OpGraph(skip.units.drop(columns=["input_bytes", "output_bytes",
                                                          "saved_bytes"]),
                                 skip.tensors.drop(columns=["first_saver", "last_consumer"]),
                                 skip.meta)
    with pytest.raises(PlanError, match="applies to chains only"):
        checkpoint(skip, "1xV100-16GB", method="optimal")
    t = checkpoint_table(skip, "1xV100-16GB", ["optimal", "sqrt"])
    assert not t.loc["optimal", "fits"] and "chains only" in t.loc["optimal", "strategy"]
    assert t.loc["sqrt", "fits"]


def test_edge_board_smallest_memory_and_cost_for_every_method():
    # 6 × 0.5 GiB saved: keeping everything does not fit a Jetson Nano's 3 GiB
    g = chain(6, saved=[GIB // 2] * 6, flops=1e10)
    t = checkpoint_table(g, "jetson-nano-4GB")
    assert list(t.index) == ["keep all", "optimal", "sqrt", "revolve", "all"]
    assert not t.loc["keep all", "fits"]
    for m in ("optimal", "sqrt", "revolve"):
        low = t.loc[m, "min_memory"]
        assert t.loc[m, "fits"] and low < 3 * GIB and t.loc[m, "overhead_at_min"] > 0
        # the smallest memory is where training still runs: at it a plan exists, below not
        s = checkpoint(g, "jetson-nano-4GB", low * 1.001, method=m)
        assert memflow.simulate(g, s, memflow.Cluster.preset("jetson-nano-4GB")
                                ).peak_memory.max() <= low * 1.001
        with pytest.raises(Infeasible) as err:
            checkpoint(g, "jetson-nano-4GB", low * 0.97, method=m)
        assert err.value.min_memory == pytest.approx(low, rel=0.01)
    assert t.loc["optimal", "min_memory"] <= t.loc["sqrt", "min_memory"] * 1.01
    assert t.loc["optimal", "time"] <= t.loc["revolve", "time"] * 1.0001
