"""The MCMC search started from each planner's strategy is never worse than the planner."""
import pytest

from memflow.errors import PlanError
from memflow.planners import checkpoint, compress_strategy, offload, pipeline
from memflow.planners.common import as_cluster
from memflow.planners.hybrid import hybrid_strategies
from memflow.search import refine
from memflow.search.refinement import search_policies

from planners.graphs import GIB, chain

V100, C4 = "1xV100-16GB", "4xV100-16GB"


def _plans():
    g = chain(6)
    yield "checkpoint", g, V100, "4GiB", checkpoint(g, V100, "4GiB", method="sqrt")
    yield "offload", g, V100, "4GiB", offload(g, V100, "knapsack", memory_limit="4GiB")
    yield "compress", g, V100, "4GiB", compress_strategy(g, V100, memory_limit="4GiB")
    yield "pipeline", chain(8), C4, None, pipeline(chain(8), C4, microbatches=4)
    h = chain(4, flops=2e11, params=2 ** 24, batch=32)
    c4 = as_cluster(C4)
    s = hybrid_strategies(h, [str(d) for d in c4.devices.index], 2, 32)["pipeline"]
    yield "hybrid", h, c4, None, s


@pytest.mark.parametrize("planner, graph, cluster, limit, plan", list(_plans()),
                         ids=lambda x: x if isinstance(x, str) else "")
def test_search_from_each_plan_is_never_worse(planner, graph, cluster, limit, plan):
    r = refine(graph, cluster, plan, iterations=15, memory_limit=limit)
    assert r["plan_fits"] and r["search_fits"] and r["never_worse"]
    assert r["search_time"] <= r["plan_time"] * (1 + 1e-9)


def test_no_offload_where_the_host_has_no_memory():
    # a Jetson's host has no memory of its own to offload to: the search must not try
    g = chain(4, saved=[GIB // 4] * 4, batch=8)
    s = checkpoint(g, "jetson-nano-4GB", method="sqrt")
    policies, _ = search_policies(as_cluster("jetson-nano-4GB"), s)
    assert "offload" not in policies
    assert "offload" in search_policies(as_cluster(V100), s)[0]
    r = refine(g, "jetson-nano-4GB", s, iterations=15)
    assert r["search_fits"] and r["never_worse"]
    assert "offload" not in r.attrs["best"].policies
    with pytest.raises(PlanError, match="strategy must be a memflow Strategy"):
        refine(g, V100, "sqrt")
