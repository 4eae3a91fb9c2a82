"""The policy table is the one place a policy lives: a toy policy registered here, without
editing memflow's files, is validated, simulated, searched and exported.

"swap" offloads to host memory (the ``host`` mechanism) at a tenth of the host link's
bandwidth — say, to an NVMe drive behind the host.
"""
import math

import numpy as np
import pytest
import torch

import memflow
from memflow.errors import StrategyError
from memflow.export import apply, validate
from memflow.search.moves import MEMORY_MOVES
from memflow.sim import Simulator
from memflow.strategy import MECHANISMS, POLICIES, Policy, Strategy, parse_policy

from export.models import captured, grads, mismatches


@pytest.fixture
def swap():
    policy = POLICIES.register(Policy("swap", "host", "offload to NVMe, a tenth of the host "
                                      "link's bandwidth", "#8c613c", host_scale=10.0))
    yield policy
    POLICIES.unregister("swap")


def chain():
    return memflow.zoo.graph("chain", batch_size=64, n=6, width=256)


def test_builtin_table():
    assert list(POLICIES) == ["keep", "recompute", "offload", "compress", "selective"]
    assert set(POLICIES[p].mechanism for p in POLICIES) == set(MECHANISMS)
    assert POLICIES.searched == ("keep", "recompute", "offload", "selective")
    assert parse_policy("u", "compress") == (POLICIES.index("compress"), 1e-3)


def test_bad_rows_and_names():
    with pytest.raises(StrategyError, match="unknown mechanism 'disk'; valid: keep"):
        Policy("swap", "disk", "", "#000000")
    with pytest.raises(StrategyError, match="already in the table"):
        POLICIES.register(Policy("keep", "keep", "", "#000000"))
    with pytest.raises(StrategyError, match="takes no parameter"):
        parse_policy("u", "offload:3")
    with pytest.raises(StrategyError, match="compress needs an error bound > 0"):
        parse_policy("u", "compress:0")


def test_registered_policy_round_trips_and_validates(swap):
    g = chain()
    s = Strategy.single_device(g).with_policy(swap=g.names[1:3])
    assert s.policies[1:3] == ["swap", "swap"] and math.isnan(s.error_bound[1])
    assert Strategy.from_json(s.to_json()) == s
    s.validate(g)
    assert "swap" in POLICIES.valid() and POLICIES.colors["swap"] == "#8c613c"


def test_swap_holds_what_offload_holds_but_moves_ten_times_slower(swap):
    g = chain()
    cluster = memflow.Cluster.preset("1xV100-16GB")
    units = g.names[1:4]
    s_off = Strategy.single_device(g).with_policy(offload=units)
    s_swap = Strategy.single_device(g).with_policy(swap=units)
    # the same mechanism: the same blocks (bytes, categories, allocating and freeing tasks)
    sim = Simulator(g, cluster)
    a, b = sim.blocks(s_off).rows, sim.blocks(s_swap).rows
    assert all(np.array_equal(a[k], b[k]) for k in a)
    off, slow = (memflow.simulate(g, s, cluster) for s in (s_off, s_swap))
    moved = {}
    for name, r in (("offload", off), ("swap", slow)):
        t = r.timeline
        host = t[t["kind"].isin(["offload", "prefetch"])]
        assert len(host) >= 2           # an offload and its prefetch at least
        moved[name] = (host["end"] - host["start"]).to_numpy()
    assert len(moved["swap"]) == len(moved["offload"])
    latency = memflow.Cluster.preset("1xV100-16GB").links["latency"].max()
    ratio = (moved["swap"] - latency) / (moved["offload"] - latency)
    assert np.allclose(ratio, 10.0, rtol=1e-6)
    assert slow.iteration_time > off.iteration_time


def test_search_proposes_the_registered_policy(swap):
    g = chain()
    search = memflow.MCMCSearch(g, memflow.Cluster.preset("1xV100-16GB"),
                                policies=("keep", "swap"), seed=0,
                                moves=dict.fromkeys(MEMORY_MOVES, 1.0))   # one precision
    search.run(iterations=60)
    proposed = set()
    for s in [search.best] + [search.current]:
        proposed |= set(s.policies)
    assert "swap" in "".join(search.history["move"].astype(str)) or "swap" in proposed
    # keep is free on a device with room, swap only costs time: the best keeps everything
    # (at one precision: under pure-bf16 a swap hides behind compute and ties with keep)
    assert set(search.best.policies) == {"keep"}


def test_export_runs_the_registered_policy_as_its_mechanism(swap):
    model, inputs, graph = captured("mlp")
    strategy = Strategy.single_device(graph).with_policy(swap=graph.names[:2])
    exported = apply(model, strategy, graph)
    assert mismatches(grads(model, inputs), grads(exported, inputs)) == []
    table = validate(model, inputs, strategy, graph)
    assert table.loc["offloaded_bytes", "predicted"] > 0
    assert table.loc["offloaded_bytes", "measured"] == table.loc["offloaded_bytes", "predicted"]
    assert isinstance(exported, torch.nn.Module)


def test_policy_colours_are_distinct_and_not_the_out_of_memory_red():
    colours = [c.lower() for c in POLICIES.colors.values()]
    assert len(set(colours)) == len(colours)
    assert "#d62728" not in colours      # the report's out-of-memory marks


def test_pins_offer_every_policy_of_the_table():
    pins = pytest.importorskip("memflow_widgets.pins")
    assert list(pins._Row().policy.options) == list(POLICIES)
    assert "selective" in POLICIES
