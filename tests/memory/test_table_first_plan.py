"""A new :class:`~memflow.memory.table.BlockTable` leaves its records' allocation, free,
carrier and compress rows unwritten (``np.empty``): :func:`~memflow.memory.replan.replan`'s
first pass writes every one. If it ever missed one, a plan would read whatever memory the
table was given; here the rows are filled with garbage before the first derive, and the plan
must be the same as a fresh table's."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import memflow
from memflow.memory.slots import NS, PRODUCED
from memflow.search.synthetic import chain_graph
from memflow.sim import Simulator
from memflow.strategy import POLICIES

GRAPH = chain_graph(8, width=64, batch=32)
CLUSTER = memflow.Cluster.preset("2xV100-16GB")


def _poisoned(table):
    records = NS * len(table.placed.layout)
    produced = np.arange(PRODUCED, records, NS)
    kept = table.alloc[produced].copy()      # the one record row the table writes
    table.alloc[:records] = -7
    table.alloc[produced] = kept
    table.free[:records] = -7
    table.carrier[:] = -7
    table.compress[:] = True
    return table


@settings(max_examples=20, deadline=None)
@given(st.lists(st.sampled_from(list(POLICIES)), min_size=len(GRAPH), max_size=len(GRAPH)),
       st.sampled_from([1, 2]))
def test_the_first_plan_writes_every_record_row(policies, devices):
    sim = Simulator(GRAPH, CLUSTER)
    s = memflow.Strategy.data_parallel(GRAPH, devices).with_policy(dict(zip(GRAPH.names,
                                                                            policies)))
    placed = sim._placed_of(s)
    fresh = sim._table(s, placed).derive(s.policy, s.segment, sim._ratios(s))
    dirty = _poisoned(sim._table(s, placed)).derive(s.policy, s.segment, sim._ratios(s))
    for name in ("bytes", "host", "alloc", "free"):
        np.testing.assert_array_equal(dirty.rows[name], fresh.rows[name], err_msg=name)
    np.testing.assert_array_equal(dirty.offloaded, fresh.offloaded)
    np.testing.assert_array_equal(dirty.compressed, fresh.compressed)
