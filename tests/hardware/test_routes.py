"""Routes, bottleneck bandwidth, latency, rings and the dense tables a simulator reads."""
import numpy as np
import pandas as pd
import pytest

from memflow.errors import ClusterError
from memflow.hardware import Cluster


@pytest.fixture(scope="module")
def two_nodes():
    return Cluster.preset("2x4xA100-80GB")


def kinds(c, a, b):
    return [c.links.at[i, "kind"] for i in c.route(a, b)]


def test_intra_node_goes_over_nvlink(two_nodes):
    c = two_nodes
    path = c.route("gpu0", "gpu3")
    assert [c.links.at[i, "kind"] for i in path] == ["nvlink", "nvlink"]
    assert [(c.links.at[i, "src"], c.links.at[i, "dst"]) for i in path] == \
        [("gpu0", "nvsw0"), ("nvsw0", "gpu3")]
    assert c.bandwidth("gpu0", "gpu3") == pytest.approx(300e9 * 0.8)
    assert c.latency("gpu0", "gpu3") == pytest.approx(2e-6)


def test_cross_node_goes_through_hosts_and_the_switch(two_nodes):
    c = two_nodes
    path = c.route("gpu1", "gpu6")
    ends = [(c.links.at[i, "src"], c.links.at[i, "dst"]) for i in path]
    assert ends == [("gpu1", "host0"), ("host0", "switch"), ("switch", "host1"), ("host1", "gpu6")]
    assert c.bandwidth("gpu1", "gpu6") == pytest.approx(min(31.5e9 * 0.8, 4 * 25e9 * 0.9))
    assert c.latency("gpu1", "gpu6") == pytest.approx(2 * 5e-6 + 2 * 2.5e-6)


def test_pcie_node_routes_through_the_host_and_offload_uses_the_host_link():
    c = Cluster.preset("4xV100-16GB-PCIe")
    assert kinds(c, "gpu0", "gpu1") == ["pcie3", "pcie3"]
    assert kinds(c, "gpu2", "host0") == ["pcie3"]
    nv = Cluster.preset("4xV100-16GB")
    assert kinds(nv, "gpu2", "host0") == ["pcie3"] and kinds(nv, "host0", "gpu2") == ["pcie3"]
    assert nv.route("gpu2", "gpu2") == [] and nv.bandwidth("gpu2", "gpu2") == float("inf")


def test_direct_device_links_are_used_and_unreachable_pairs_raise():
    c = Cluster.from_dict({
        "devices": [{"device": d, "node": 0, "memory_bytes": 1e9, "host": "h"} for d in "abc"],
        "hosts": [{"host": "h", "node": 0, "memory_bytes": 1e10}],
        "links": [{"src": "a", "dst": "b", "kind": "nvlink", "bandwidth": 50e9},
                  {"src": "a", "dst": "h", "kind": "pcie3"},
                  {"src": "h", "dst": "b", "kind": "pcie3"},
                  {"src": "h", "dst": "c", "kind": "pcie3"}]})
    assert c.route("a", "b") == [0]
    assert c.route("a", "c") == [1, 3]
    with pytest.raises(ClusterError, match="no route from 'b' to 'a'"):
        c.route("b", "a")
    a = c.arrays
    assert a.bandwidth[1, 0] == 0 and a.latency[1, 0] == np.inf
    assert a.routes[0, 1].tolist() == [0, -1] and a.routes[0, 2].tolist() == [1, 3]
    with pytest.raises(ClusterError, match="not a device, host or switch"):
        c.route("a", "zz")


def test_dense_tables_agree_with_scalar_lookups(two_nodes):
    c = two_nodes
    a = c.arrays
    names = list(c.devices.index)
    n = len(names)
    assert a.routes.shape[:2] == (n, n) and a.bandwidth.shape == (n, n)
    for i in range(n):
        for j in range(n):
            r = a.routes[i, j]
            assert r[r >= 0].tolist() == c.route(names[i], names[j])
            if i != j:
                assert a.bandwidth[i, j] == pytest.approx(c.bandwidth(names[i], names[j]))
                assert a.latency[i, j] == pytest.approx(c.latency(names[i], names[j]))
    assert np.isinf(np.diag(a.bandwidth)).all() and (np.diag(a.latency) == 0).all()
    assert a.transfer_time(0, 5, 1e9) == pytest.approx(1e9 / (31.5e9 * 0.8) + 15e-6)
    assert a.host_route(5).tolist() == c.route("gpu5", "host1")
    assert a.host_route(5, to_host=False).tolist() == c.route("host1", "gpu5")
    assert a.peak_flops("float16")[0] == 312e12 and a.peak_flops("float32")[0] == 19.5e12


def test_ring_bandwidth_counts_links_shared_by_hops(two_nodes):
    c = two_nodes
    node0 = ["gpu0", "gpu1", "gpu2", "gpu3"]
    assert c.ring_bandwidth(node0) == pytest.approx(300e9 * 0.8)
    assert c.ring_bandwidth(["gpu0"]) == float("inf")
    # node-major ring: two hops cross the network, each over its own PCIe links
    assert c.ring_bandwidth(list(c.devices.index)) == pytest.approx(31.5e9 * 0.8)
    # interleaved ring: all 8 hops cross nodes, four share each host-switch link
    interleaved = ["gpu0", "gpu4", "gpu1", "gpu5", "gpu2", "gpu6", "gpu3", "gpu7"]
    assert c.ring_bandwidth(interleaved) == pytest.approx(4 * 25e9 * 0.9 / 4)
    assert c.ring_latency(interleaved) == pytest.approx(15e-6)
    with pytest.raises(ClusterError, match="unknown device 'gpu9'"):
        c.ring_bandwidth(["gpu0", "gpu9"])


def test_dense_tables_for_1024_gpus():
    c = Cluster.build("A100-80GB", gpus_per_node=8, nodes=128)
    a = c.arrays
    assert a.bandwidth.shape == (1024, 1024)
    assert a.bandwidth[0, 1] == pytest.approx(240e9)
    assert a.bandwidth[0, 1023] == pytest.approx(25.2e9)
    rng = np.random.default_rng(0)
    for i, j in rng.integers(0, 1024, size=(20, 2)):
        r = a.routes[i, j]
        assert r[r >= 0].tolist() == a.route(int(i), int(j)).tolist()
    assert isinstance(c.links, pd.DataFrame)
