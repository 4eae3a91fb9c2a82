"""What recomputing one more unit does to the step time (docs/data-model.md, time model).

The schedule is a longest path, so more work never shortens a step; but a recompute segment
holds its inputs on the device, which can cancel a neighbour's offload of the same storage.
So the invariant is: with keep and recompute only, recomputing one more unit never makes the
step faster; with offload too, only when host transfers shrink.
"""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from planners.graphs import GIB, chain

import memflow
from memflow.graph import OpGraph
from memflow.search.synthetic import chain_graph
from memflow.sim.kinds import K_OFFLOAD, K_PREFETCH

ONE, FOUR = memflow.Cluster.preset("1xV100-16GB"), memflow.Cluster.preset("4xV100-16GB")


def host_bytes(sim, s):
    t = sim.run(s).tasks
    return float(t.work[np.isin(t.kind, [K_OFFLOAD, K_PREFETCH])].sum())


@settings(max_examples=25, deadline=None)
@given(n=st.integers(3, 7), seed=st.integers(0, 1000), four=st.booleans(),
       activation=st.sampled_from(["gelu", "relu"]), with_offload=st.booleans(),
       data=st.data())
def test_one_more_recomputed_unit_is_never_faster_unless_transfers_shrink(
        n, seed, four, activation, with_offload, data):
    g = chain_graph(n, width=256, batch=512, seed=seed, activation=activation)
    cluster = FOUR if four else ONE
    sim = memflow.sim.Simulator(g, cluster)
    base = memflow.Strategy.data_parallel(g, 4) if four else memflow.Strategy.single_device(g)
    choices = ["keep", "recompute"] + (["offload"] if with_offload else [])
    policies = data.draw(st.lists(st.sampled_from(choices), min_size=n, max_size=n))
    s = base.with_policy(dict(zip(g.names, policies)))
    before, host = sim.evaluate(s).iteration_time, host_bytes(sim, s)
    for i in (i for i, p in enumerate(policies) if p == "keep"):
        more = s.with_policy({g.names[i]: "recompute"})
        after = sim.evaluate(more).iteration_time
        if host_bytes(sim, more) >= host:       # always so with keep and recompute only
            assert after >= before * (1 - 1e-12), (policies, g.names[i])


def test_recomputing_after_an_offload_can_be_faster_at_the_same_peak():
    """The documented exception, by hand: u1 saves its own output (as ResNet's last ReLU of a
    block does), u2 reads it without saving it. With u1 offloaded, recomputing u2 makes that
    output u2's segment input, held on the device, so only half of u1's bytes go to the host."""
    g = chain(3, saved=[GIB // 4] * 3, flops=1e9)
    t = g.tensors
    t.at[t.index[2], "savers"] = ["u1"]          # u1 saves its output; u2 only reads it
    t.at[t.index[3], "savers"], t.at[t.index[3], "bytes"] = ["u2"], GIB // 8
    g = OpGraph(g.units.drop(columns=["input_bytes", "output_bytes", "saved_bytes"]),
                t.drop(columns=["first_saver", "last_consumer"]), g.meta)
    sim = memflow.sim.Simulator(g, ONE)
    s = memflow.Strategy.single_device(g).with_policy({"u1": "offload"})
    more = s.with_policy({"u2": "recompute"})
    a, b = sim.evaluate(s), sim.evaluate(more)
    assert b.iteration_time < 0.6 * a.iteration_time and b.peak.max() == a.peak.max()
    assert host_bytes(sim, more) == host_bytes(sim, s) / 2
