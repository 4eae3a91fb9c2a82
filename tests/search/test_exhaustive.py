"""Exhaustive enumeration: the space it lists, its optimum, and its refusal of big spaces."""
import pytest

from memflow.errors import SearchError
from memflow.graph import OpGraph
from memflow.search import exhaustive

from .helpers import V100, chain


def test_lists_every_assignment_and_picks_the_fastest_fit():
    g = chain(4)
    full = exhaustive(g, V100)
    limit = full.table["peak"].median()
    res = exhaustive(g, V100, memory_limit=limit)
    fits = res.table[res.table["peak"] <= limit]
    assert res.evaluated == 16 == len(res.table)
    assert res.feasible and res.time == fits["time"].min()


def test_offload_and_compress_policies_and_a_subset_of_units():
    res = exhaustive(chain(5), V100, policies=("keep", "offload", "compress:1e-2"),
                     units=["l1", "l3"])
    assert res.evaluated == 9
    assert set(res.table["l1"]) == {"keep", "offload", "compress:0.01"}


def test_too_big_says_how_big():
    with pytest.raises(SearchError, match=r"3\^12 = 531,441 assignments exceed"):
        exhaustive(chain(12), V100, policies=("keep", "recompute", "offload"))


def test_nothing_fits_returns_the_least_cost_marked_infeasible():
    res = exhaustive(chain(4), V100, memory_limit=1e3)
    assert not res.feasible and not res.table["feasible"].any()


def test_units_that_cannot_be_recomputed_are_only_kept():
    g = chain(3)
    units = g.units.drop(columns=["input_bytes", "output_bytes", "saved_bytes"])
    units["recomputable"] = [True, False, True]
    g2 = OpGraph(units, g.tensors.drop(columns=["first_saver", "last_consumer"]), g.meta)
    res = exhaustive(g2, V100)
    assert res.evaluated == 4 and set(res.table["l1"]) == {"keep"}


def test_unknown_unit():
    with pytest.raises(SearchError, match="'nope' is not a unit"):
        exhaustive(chain(3), V100, units=["nope"])
