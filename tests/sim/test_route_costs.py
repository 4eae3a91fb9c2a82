"""The costs of a placement's routes (copies between placements, its rings, its host links),
made in one numpy pass over the concatenated routes, are to the bit what a loop over the
routes, one link at a time, gives (the loops below are the ones they replaced)."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import memflow
from memflow.sim.costs import _parts, _slowest_route, copy_cost, layout_cost

CLUSTERS = {**{k: memflow.Cluster.preset(k).arrays for k in ("2x4xV100-16GB", "8xV100-32GB")},
            "8x8xA100-80GB": memflow.Cluster.build("A100-80GB", 8, 8).arrays}


def _ring_loop(ca, groups, route):
    size = len(groups[0]) if groups else 1
    if size < 2:
        return float("inf"), 0.0, size
    use: dict[int, int] = {}
    lat = 0.0
    for g in groups:
        for x, y in zip(g.tolist(), np.roll(g, -1).tolist()):
            path = route(x, y)
            for lid in path:
                use[lid] = use.get(lid, 0) + 1
            lat = max(lat, float(ca.link_latency[path].sum()))
    return float(min(ca.link_rate[lid] / c for lid, c in use.items())), lat, size


def _host_links_loop(ca, devs, up, route):
    n = len(ca.devices)
    links: list[int] = []
    slow, lat = 0.0, 0.0
    for d in devs.tolist():
        h = n + int(ca.host[d])
        path = route(d, h) if up else route(h, d)
        links += path
        slow = max(slow, float(np.max(1.0 / ca.link_rate[path])) if path else 0.0)
        lat = max(lat, float(ca.link_latency[path].sum()))
    return np.unique(np.asarray(links, np.int64)), slow, lat


def _copy_loop(ca, src, dst, per_sample, route):
    """copy_cost's overlap, then its routes one pair and one link at a time."""
    s1, p1, a1, n1 = src
    s2, p2, a2, n2 = dst
    d1, d2 = ca.devices.get_indexer(list(n1)), ca.devices.get_indexer(list(n2))
    P1, P2 = _parts((s1, p1, a1)), _parts((s2, p2, a2))
    si, ai, pi = (P2[:, j, None] for j in range(3))
    sj, aj, pj = (P1[None, :, j] for j in range(3))
    if per_sample:
        ov = (np.maximum(0.0, np.minimum((si + 1) / s2, (sj + 1) / s1)
                         - np.maximum(si / s2, sj / s1))
              * np.maximum(0.0, np.minimum((ai + 1) / a2, (aj + 1) / a1)
                           - np.maximum(ai / a2, aj / a1)))
    else:
        ov = ((sj == si % s1) & (aj == ai % a1)).astype(np.float64)
    region = P1[:, 0] * a1 + P1[:, 1]
    held = np.zeros((s1 * a1, len(ca.devices)), bool)
    held[region, d1] = True
    need = (pj == pi % p1) & (ov > 0) & ~held[region[None, :], d2[:, None]]
    load: dict[int, float] = {}
    lat = 0.0
    for k2, k1 in zip(*np.nonzero(need)):
        path = route(int(d1[k1]), int(d2[k2]))
        for lid in path:
            load[lid] = load.get(lid, 0.0) + float(ov[k2, k1])
        lat = max(lat, float(ca.link_latency[path].sum()))
    if not load:
        return np.zeros(0, np.int64), 0.0, 0.0
    links = np.fromiter(load, np.int64, len(load))
    return links, float(max(f / ca.link_rate[lid] for lid, f in load.items())), lat


@st.composite
def placements(draw, ca):
    """A placement ``(sample, parameter, attribute, devices)`` on distinct devices of ``ca``."""
    names = list(ca.devices)
    s, p, a = (draw(st.sampled_from([1, 2, 4, 8])) for _ in range(3))
    k = s * p * a
    if k > len(names):
        s, p, a, k = 1, 1, 1, 1
    devs = draw(st.permutations(names))[:k]
    return (s, p, a, tuple(devs))


@settings(max_examples=60, deadline=None)
@given(st.data(), st.sampled_from(sorted(CLUSTERS)), st.booleans())
def test_route_costs_equal_the_loops_over_routes(data, name, per_sample):
    ca = CLUSTERS[name]
    route = ca.routing.route
    src, dst = data.draw(placements(ca)), data.draw(placements(ca))
    links, per_byte, lat = copy_cost(ca, src, dst, per_sample)
    ref = _copy_loop(ca, src, dst, per_sample, route)
    assert np.array_equal(links, ref[0]) and per_byte == ref[1] and lat == ref[2]
    lc = layout_cost(ca, src)
    s, p, a, _ = src
    parts = _parts((s, p, a))
    devs = lc.devices
    assert lc.param_ring == _ring_loop(ca, [devs[(parts[:, 0] == i) & (parts[:, 1] == j)]
                                            for i in range(s) for j in range(a)], route)
    assert lc.replica_ring == _ring_loop(ca, [devs[parts[:, 2] == i] for i in range(p)], route)
    for up, got in ((True, lc.d2h), (False, lc.h2d)):
        want = _host_links_loop(ca, devs, up, route)
        assert np.array_equal(got[0], want[0]) and got[1:] == want[1:]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(1e-9, 1e6), min_size=1, max_size=40),
       st.lists(st.integers(0, 300), max_size=8), st.data())
def test_the_compiled_slowest_route_sums_as_add_reduceat(latency, lens, data):
    """Routes' latencies summed by the compiled pass are, to the bit, what
    ``np.add.reduceat`` over the concatenated routes gave (its first term plus numpy's
    pairwise sum of the rest: not a left-to-right sum for three links or more)."""
    latency = np.asarray(latency)
    lens = np.asarray(lens, np.int64)
    flat = np.asarray(data.draw(st.lists(st.integers(0, len(latency) - 1),
                                         min_size=int(lens.sum()), max_size=int(lens.sum()))),
                      np.int64)
    starts = np.cumsum(lens) - lens
    want = (float(np.max(np.add.reduceat(latency[flat], starts[lens > 0]), initial=0.0))
            if len(flat) else 0.0)
    assert _slowest_route(latency, flat, lens) == want
