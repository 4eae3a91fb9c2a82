"""Offloading planners on hand-checked chains."""
import numpy as np
import pytest

import memflow
from memflow.errors import PlanError
from memflow.graph import OpGraph
from memflow.planners import Infeasible, offload, offload_table
from memflow.planners.common import Profile
from memflow.planners.offload import fluid_choice, knapsack_choice

from .graphs import GIB, chain

KINDS = ["Conv2d", "ReLU"] * 3
V100 = "1xV100-16GB"


def test_static_policies():
    g = chain(6, kinds=KINDS)
    assert offload(g, "1xV100-16GB", "none").policies == ["keep"] * 6
    assert offload(g, "1xV100-16GB", "all").policies == ["offload"] * 6
    assert offload(g, "1xV100-16GB", "conv").policies == ["offload", "keep"] * 3


def test_dynamic_tries_none_then_conv_then_all():
    g = chain(6, kinds=KINDS)
    c = memflow.Cluster.preset("1xV100-16GB")
    peak = {p: memflow.simulate(g, offload(g, c, p), c).peak_memory.max()
            for p in ("none", "conv", "all")}
    assert peak["all"] < peak["conv"] < peak["none"]
    assert offload(g, c, "dynamic").name == "no offload"
    assert offload(g, c, "dynamic", memory_limit=peak["conv"]).name == "vDNN conv"
    assert offload(g, c, "dynamic", memory_limit=peak["all"]).name == "vDNN all"
    with pytest.raises(Infeasible) as err:
        offload(g, c, "dynamic", memory_limit=peak["all"] - 1)
    assert err.value.min_memory == pytest.approx(peak["all"])


def slow_link_chain():
    # 1 GiB per unit over PCIe3 (~12.6 GB/s achieved) takes ~85 ms; each unit computes ~60 ms
    # forward and ~120 ms backward, so a late unit's prefetch cannot hide but an early one can.
    return chain(8, flops=5e11)


@pytest.mark.parametrize("policy", ["knapsack", "fluid"])
def test_heuristics_free_enough_and_prefer_early_units(policy):
    g = slow_link_chain()
    c = memflow.Cluster.preset("1xV100-16GB")
    keep = memflow.simulate(g, offload(g, c, "none"), c)
    limit = keep.peak_memory.max() - 2.5 * GIB
    s = offload(g, c, policy, memory_limit=limit)
    r = memflow.simulate(g, s, c)
    assert r.peak_memory.max() <= limit
    chosen = [i for i, p in enumerate(s.policies) if p == "offload"]
    assert 3 <= len(chosen) < 8 and max(chosen) < 6      # the last units stay on the device
    every = memflow.simulate(g, offload(g, c, "all"), c)
    assert r.iteration_time <= every.iteration_time


def test_choices_by_hand():
    p = Profile(fwd=np.ones(4), bwd=np.full(4, 2.0), saved=np.array([4.0, 5.0, 1.0, 1.0]),
                d2h=1.0, h2d=1.0, latency=0.0)
    every = np.ones(4, bool)
    assert not knapsack_choice(p, 0.0, every).any()
    assert knapsack_choice(p, 100.0, every).all()          # more than there is: everything
    only = np.array([False, True, True, False])
    assert knapsack_choice(p, 5.5, only).tolist() == [False, True, True, False]
    assert fluid_choice(p, 11.0, every).all()


def test_table_and_edge_board():
    g = chain(6, kinds=KINDS)
    t = offload_table(g, "1xV100-16GB", ["none", "all", "conv"])
    assert list(t.index) == ["none", "all", "conv"] and t["fits"].all()
    assert t.loc["none", "loss"] == pytest.approx(0.0) and t.loc["all", "offloaded"] > 0
    # an edge board's host is the GPU's own memory pool: offloading frees nothing
    with pytest.raises(Infeasible):
        offload(g, "jetson-nano-4GB", "all", memory_limit="8GiB")


def test_inputs_are_checked():
    g = chain(3)
    with pytest.raises(PlanError, match="unknown policy 'swap'; valid: none, all, conv"):
        offload(g, "1xV100-16GB", "swap")
    with pytest.raises(PlanError, match="memory_limit"):
        offload(g, "1xV100-16GB", "all", memory_limit="lots")


@pytest.mark.parametrize("policy", ["knapsack", "fluid"])
def test_heuristics_meet_a_limit_that_needs_whole_gib(policy):
    # 6 GiB saved, 4 GiB allowed: exactly 2 GiB must go, plus the few bytes of the output —
    # a knapsack solver's tolerance once accepted the two units that leave 8 bytes too many
    g = chain(6)
    s = offload(g, V100, policy, memory_limit="4GiB")
    assert memflow.simulate(g, s, memflow.Cluster.preset(V100)).peak_memory.max() <= 4 * GIB
    assert 3 <= s.policies.count("offload") < 6


def test_knapsack_covers_a_backward_peak_with_the_units_on_the_host_then():
    # 5 units of 1 GiB; u3's backward needs a 2 GiB temporary, so the peak (6 GiB) is there:
    # u0..u3 are saved and only u0, u1 can be on the host (u2 is being prefetched, vDNN's
    # rule). At 4.5 GiB both must go, and that is enough (the turn needs 1 GiB off). u1, u2
    # compute little, so the prefetches of u0, u1 are the exposed ones and the knapsack's
    # turn-only model prefers u2, u3, which free nothing at u3's backward.
    g = chain(5)
    u = g.units.copy()
    u["bwd_tmp_bytes"] = [0, 0, 0, 2 * GIB, 0]
    u["fwd_flops"] = [1e12, 1e10, 1e10, 1e12, 1e12]
    u["bwd_flops"] = 2 * u["fwd_flops"]
    g = OpGraph(u, g.tensors, {"batch_size": 8, "model": "chain"})
    c = memflow.Cluster.preset(V100)
    s = offload(g, c, "knapsack", memory_limit=4.5 * GIB)
    assert s.policies == ["offload", "offload", "keep", "keep", "keep"]
    r = memflow.simulate(g, s, c)
    assert r.peak_memory.max() <= 4.5 * GIB
    assert r.iteration_time < memflow.simulate(g, offload(g, c, "all"), c).iteration_time


def test_the_loss_unit_is_never_offloaded():
    # the loss runs in the user's training loop: export keeps it, so no plan may offload it
    import torch
    from torch import nn
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 4))
    g = memflow.from_torch(model, torch.randn(2, 8), loss_fn=lambda out: out.pow(2).mean())
    assert g.units.loc["<loss>", "saved_bytes"] > 0
    s = offload(g, V100, "all")
    assert dict(zip(s.units, s.policies))["<loss>"] == "keep"
    assert s.policies.count("offload") == int((g.units["saved_bytes"] > 0).sum()) - 1
