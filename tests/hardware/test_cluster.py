"""Validation, JSON round trip, derived clusters and display."""
import json

import pytest

from memflow.errors import ClusterError, FileFormatError
from memflow.hardware import Cluster


def small(**change):
    doc = {
        "name": "lab",
        "devices": [{"device": "gpu0", "node": 0, "memory_bytes": 8e9, "host": "host0"},
                    {"device": "gpu1", "node": 0, "memory_bytes": 8e9, "host": "host0"}],
        "hosts": [{"host": "host0", "node": 0, "memory_bytes": 64e9}],
        "links": [{"src": s, "dst": d, "kind": "pcie3"}
                  for s, d in [("gpu0", "host0"), ("host0", "gpu0"),
                               ("gpu1", "host0"), ("host0", "gpu1")]],
    }
    doc.update(change)
    return doc


def test_from_dict_fills_defaults():
    c = Cluster.from_dict(small())
    assert c.name == "lab"
    assert c.links["bandwidth"].eq(15.75e9).all() and c.links["efficiency"].eq(0.8).all()
    # no fast FP16 given: the FP32 rate is used
    assert (c.devices["peak_flops_fp16"] == c.devices["peak_flops_fp32"]).all()
    assert c.route("gpu0", "gpu1") == [0, 3]


@pytest.mark.parametrize("change, message", [
    (lambda d: d["devices"][1].update(memory_bytes=-5), "device 'gpu1': memory_bytes is negative"),
    (lambda d: d["devices"][0].update(memory_bytes="lots"), "device 'gpu0': memory_bytes must be a number"),
    (lambda d: d["devices"][0].update(host="host7"), "device 'gpu0': host 'host7' is not a host"),
    (lambda d: d["devices"][0].pop("host"), "device 'gpu0': host nan is not a host"),
    (lambda d: d["devices"][0].update(compute_efficiency=1.5), "device 'gpu0': compute_efficiency must be in"),
    (lambda d: d["devices"][1].update(device="gpu0"), "repeated: \\['gpu0'\\]"),
    (lambda d: d["links"][2].update(kind="token-ring"), "link 2 \\(gpu1 -> host0\\): unknown kind 'token-ring'; valid: \\['ethernet'"),
    (lambda d: d["links"][3].update(dst="gpu9"), "link 3: dst 'gpu9' is not a device, host or switch"),
    (lambda d: d["links"][0].update(kind="nvlink"), "link 0 \\(nvlink\\): bandwidth must be > 0"),
    (lambda d: d["links"][0].update(efficiency=0), "link 0: efficiency must be in"),
    (lambda d: d["hosts"][0].update(memory_bytes=-1), "host 'host0': memory_bytes must be >= 0"),
    (lambda d: d.pop("links"), "lacks \\['links'\\]"),
    (lambda d: d.update(devices=[]), "devices is empty"),
    (lambda d: d["hosts"].append({"host": "gpu0", "node": 0, "memory_bytes": 1}), "'gpu0' names both a device and a host"),
    (lambda d: d.update(switches=[{"switch": "sw", "kind": "hub"}]), "switch 'sw': unknown kind 'hub'"),
])
def test_validation_names_the_field_and_what_is_valid(change, message):
    doc = small()
    change(doc)
    with pytest.raises(ClusterError, match=message):
        Cluster.from_dict(doc)


def test_json_round_trip(tmp_path):
    for name in ("2x4xA100-80GB", "jetson-nano-4GB", "4xK80"):
        c = Cluster.preset(name)
        path = tmp_path / f"{name}.json"
        c.to_json(path)
        back = Cluster.from_json(path)
        assert back == c and back.name == name
        assert back.route("gpu0", f"gpu{len(c) - 1}") == c.route("gpu0", f"gpu{len(c) - 1}")
    assert Cluster.from_dict(json.loads(json.dumps(c.to_dict()))) == c


def test_json_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.json"
    doc = small(format="memflow.cluster/1")
    doc["devices"][0]["memory_bytes"] = -1
    bad.write_text(json.dumps(doc))
    with pytest.raises(ClusterError, match="bad.json: device 'gpu0': memory_bytes is negative"):
        Cluster.from_json(bad)
    other = tmp_path / "other.json"
    other.write_text('{"format": "memflow.strategy/1"}')
    with pytest.raises(FileFormatError, match="other.json"):
        Cluster.from_json(other)
    future = tmp_path / "future.json"
    future.write_text('{"format": "memflow.cluster/9"}')
    with pytest.raises(ClusterError, match="future.json: format"):
        Cluster.from_json(future)


def test_with_memory_and_replace_derive_new_clusters():
    c = Cluster.preset("4xV100-32GB")
    capped = c.with_memory("8GiB")
    assert capped.devices["memory_bytes"].eq(8 * 2 ** 30).all()
    assert c.devices["memory_bytes"].eq(32 * 2 ** 30).all()          # original untouched
    one = c.with_memory({"gpu2": 4e9})
    assert one.devices["memory_bytes"].tolist() == [32 * 2 ** 30] * 2 + [4e9, 32 * 2 ** 30]
    slow = c.replace(compute_efficiency=0.3, launch_overhead=1e-5, devices=["gpu0", "gpu1"])
    assert slow.devices["compute_efficiency"].tolist() == [0.3, 0.3, 0.6, 0.6]
    with pytest.raises(ClusterError, match="memory_bytes is negative"):
        c.with_memory(-1)
    with pytest.raises(ClusterError, match="cannot read a size from '8 parsecs'"):
        c.with_memory("8 parsecs")
    with pytest.raises(ClusterError, match="unknown device 'gpu9'"):
        c.with_memory(1e9, devices=["gpu9"])
    with pytest.raises(ClusterError, match="cannot set device column 'host'"):
        c.replace(host="host1")


def test_display():
    c = Cluster.preset("2x8xH100-80GB")
    text = c.summary()
    assert "16 devices on 2 node(s)" in text and "16 x H100-80GB" in text
    assert "ib-ndr" in text
    page = c._repr_html_()
    assert "<table" in page and "nvlink" in page
    assert repr(c).startswith("<Cluster '2x8xH100-80GB': 16 devices")
