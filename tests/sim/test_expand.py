"""The expansion's per-unit host-transfer factor (Timing.host_scale)."""
from dataclasses import replace

import numpy as np

from memflow.sim import K_OFFLOAD, K_PREFETCH, Simulator
from memflow.sim.expand import expand
from memflow.strategy import Strategy

from .graphs import chain, cluster


def test_host_scale_multiplies_the_seconds_per_byte_of_that_units_host_transfers():
    g = chain()
    s = Strategy.single_device(g).with_policy(offload=["u0", "u1"])
    sim = Simulator(g, cluster("1xV100-16GB"))
    P = sim.placement(s)
    plan = P.blocks.derive(s.policy, s.segment, sim._ratios(s))
    base = expand(P.structure, P.timing, plan)
    scale = np.ones(len(g.names))
    scale[1] = 3.0
    scaled = expand(P.structure, replace(P.timing, host_scale=scale), plan)
    host = np.isin(base.kind, (K_OFFLOAD, K_PREFETCH))
    latency = np.where(base.kind == K_OFFLOAD, P.timing.d2h[0, 1], P.timing.h2d[0, 1])
    u1 = host & (base.unit == 1)
    assert u1.sum() == 2 and (host & (base.unit == 0)).sum() == 2
    assert np.allclose(scaled.duration[u1] - latency[u1], 3 * (base.duration[u1] - latency[u1]))
    assert np.array_equal(scaled.duration[~u1], base.duration[~u1])
