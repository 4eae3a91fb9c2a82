"""Compression ratios per map kind: capture labels each saved storage with its kind, the memory
model charges each record its kind's ratio, and that ratio is what the compressor achieves."""
import numpy as np
import pytest
import torch
from torch import nn

import memflow
from memflow.compress import choose, compress
from memflow.compress.model import BY_KIND, expected_ratio
from memflow.export import apply
from memflow.graph.mapkind import MAP_KINDS, UNCOMPRESSED, kind_code, kind_of, saved_maps
from memflow.memory.measure import memtracker_peak
from memflow.memory.blocks import step_blocks
from memflow.planners.compress_measure import map_bits
from memflow.sim.cpu_time import compression_ratios, step_ratio
from memflow.strategy import Strategy


class BasicConv(nn.Module):
    """Inception's unit: a convolution, batch norm (its input a signed map) and ReLU."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x):
        return torch.relu_(self.bn(self.conv(x)))


def net() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(BasicConv(3, 16), BasicConv(16, 32), nn.MaxPool2d(2),
                          BasicConv(32, 32), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(32, 10))
    return model, torch.randn(4, 3, 48, 48)


def test_kind_rules():
    assert kind_of("relu", ["signed"]) == kind_of("threshold_", []) == "rectified"
    assert kind_of("relu_", ["normalized"]) == "normalized-rectified"
    assert kind_of("native_layer_norm", ["signed"]) == "normalized"
    assert kind_of("max_pool2d_with_indices", ["rectified"], floating=False) == "integer"
    assert kind_of("_softmax", ["signed"]) == "probability"
    assert kind_of("cat", ["rectified", "rectified"]) == "rectified"
    assert kind_of("cat", ["rectified", "probability"]) == "signed"
    assert kind_of("convolution", ["rectified"]) == "signed"
    with pytest.raises(ValueError, match="map_kind must be one of"):
        kind_code("positive")


def test_capture_labels_saved_maps_by_the_op_that_wrote_them():
    model, x = net()
    g = memflow.from_torch(model, x, units="blocks")
    t = g.tensors[g.tensors["savers"].map(len) > 0]
    big = t[t["bytes"] >= 4096 * 4]
    # per BasicConv: the convolution's output (batch norm's input) is signed; ReLU's
    # in-place output of batch norm's, saved by ReLU and read by the next convolution,
    # normalized-rectified
    kinds = {(p, k) for p, k in zip(big["producer"], big["map_kind"])}
    assert {("0", "signed"), ("0", "normalized-rectified"), ("1", "signed"),
            ("1", "normalized-rectified")} <= kinds
    pooled = big[(big["producer"] == "2") & (big["dtype"] == "float32")]
    assert set(pooled["map_kind"]) == {"normalized-rectified"}
    assert big.loc[big["producer"] == "<input>", "map_kind"].tolist() == ["signed"]
    # the max-pool's int64 indices: export keeps them as they are, so does the memory model
    assert set(t.loc[t["dtype"] == "int64", "map_kind"]) == {"integer"}
    # the same rule on real tensors (what the ratios are measured on) finds the same kinds
    real = {kind for m, kind in saved_maps(model, x, min_numel=4096)}
    assert real == set(big["map_kind"]) - UNCOMPRESSED       # saved_maps: floating maps


def test_every_kind_is_measured_for_every_compressor():
    for compressor in ("sz3", "quantizer"):
        assert {k for c, k in BY_KIND if c == compressor} == {*MAP_KINDS, "all"} - UNCOMPRESSED


@pytest.mark.parametrize("kind", ["normalized-rectified", "signed"])
def test_the_charged_ratio_is_what_the_compressor_packs(kind):
    """The ratio the memory model charges a record of each kind, measured on the model's own
    maps before the step (``map_bits``), is within 15% of what the step's compressor (SZ3
    on the CPU where pysz is installed, else the quantizer) packs such maps into: ReLU
    outputs of batch norm, and batch norm's signed inputs, whose spread is their weights'
    (SZ3 at 1e-2: 6.0x pooled over the zoo's signed maps, 4.7x on these)."""
    model, x = net()
    maps = [t for t, k in saved_maps(model, x, min_numel=4096) if k == kind]
    assert maps
    compressor = choose("cpu")
    achieved = (sum(t.numel() * t.element_size() for t in maps)
                / sum(compress(t, 1e-2, compressor=compressor).nbytes for t in maps))
    bits = map_bits(model, x, error_bounds=[1e-2])
    assert bits["compressor"] == compressor
    charged = step_ratio(True, bits)(1e-2, "float32", kind)
    assert charged != expected_ratio(1e-2, compressor=compressor, kind=kind)   # not the zoo's
    assert charged == pytest.approx(achieved, rel=0.15), (kind, compressor, achieved)


def test_the_measured_ratios_reach_the_estimate():
    """A graph carrying its model's measured bits is charged them: held bytes of a
    compressed step follow the figure, and the model's inputs are held whole."""
    model, x = net()
    g = memflow.from_torch(model, x, units="blocks")
    body = [u for u in g.names if u != "<loss>"]
    s = Strategy.single_device(g).with_policy({u: "compress:0.01" for u in body})
    table = memflow.estimate(g, "cpu", strategy=s).loc["activations", "max"]
    g.meta["map_bits"] = map_bits(model, x, error_bounds=[1e-2])
    own = memflow.estimate(g, "cpu", strategy=s).loc["activations", "max"]
    assert own != table
    g.meta["map_bits"] = {"compressor": "none", "bits": {}}      # another compressor's: unused
    assert memflow.estimate(g, "cpu", strategy=s).loc["activations", "max"] == table


def test_each_record_is_charged_its_kinds_ratio():
    model, x = net()
    g = memflow.from_torch(model, x, units="blocks")
    body = [u for u in g.names if u != "<loss>"]
    s = Strategy.single_device(g).with_policy({u: "compress:0.01" for u in body})
    ga = memflow.memory.arrays.graph_arrays(g)
    degrees = np.array([k[:3] for k in s.layouts], np.int64)

    def held(ratio) -> float:
        plan = step_blocks(ga, s.policy, s.segment, s.layout_ids, degrees, 1, ratio)
        return float(plan.held_for_backward()[0].sum())

    ratios = compression_ratios(s, ga.half, step_ratio(True))
    assert ratios.shape == (len(g), len(MAP_KINDS))
    rect = ratios.copy()
    k = kind_code("normalized-rectified")
    rect[:, k] = 1.0                           # ReLU maps held whole
    saved = g.tensors[g.tensors["savers"].map(len) > 0]
    rectified = saved.loc[saved["map_kind"] == MAP_KINDS[k], "bytes"].sum()
    r = ratios[0, k]
    assert held(rect) - held(ratios) == pytest.approx(rectified * (1 - 1 / r), rel=1e-6)


@pytest.mark.xfail(strict=True, reason=(
    "open: this step peaks in its forward (MemTracker: no parameter gradient yet, 5.22 MB "
    "against 4.32 MB estimated with adamw, 4.37 MB on the model's own measured ratios, "
    "peaking in backward), where export packs each map as autograd saves it "
    "while the forward still holds the map, and SZ3's compress holds a reconstruction and a "
    "miss mask beside it; the memory model packs at the unit's compress task, no scratch"))
@pytest.mark.parametrize("optimizer", ["adamw", "momentum"])
def test_a_compressed_cnn_step_peaks_as_memtracker_measures(optimizer):
    """Conv, batch norm, ReLU units, every one compressed at 1e-2 through export: the step's
    peak (MemTracker, the second step) within 1% of the estimate."""
    model, x = net()
    g = memflow.from_torch(model, x, units="blocks")
    body = [u for u in g.names if u != "<loss>"]
    s = Strategy.single_device(g).with_policy({u: "compress:0.01" for u in body})
    exported = apply(model, s, g, devices={"gpu0": "cpu"})
    measured = memtracker_peak(exported, x, optimizer=optimizer)["Total"]
    predicted = memflow.estimate(g, "cpu", optimizer={"adamw": "adam"}.get(optimizer, optimizer),
                                 strategy=s).loc["total", "at_peak"]
    assert predicted == pytest.approx(measured, rel=0.01), (predicted, measured)
