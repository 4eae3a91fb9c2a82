"""Op shapes in capture and the shape-class rate table of the CPU time model (issue 18)."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

import memflow
from memflow.errors import GraphError
from memflow.graph import OpGraph
from memflow.graph.opcost import KERNEL_CLASSES, kernel_shape
from memflow.hardware import kernels
from memflow.hardware.local import EXAMPLE_FIGURES, local_cluster

aten = torch.ops.aten


def test_kernel_shapes_of_products_and_convolutions():
    a, b = torch.ones(2, 8, 16), torch.ones(2, 16, 4)
    assert kernel_shape(aten.bmm.default, (a, b), None) == ("matmul", 8, 4, 16, 2)
    assert kernel_shape(aten.addmm.default, (torch.ones(4), a[0], b[0]), None) == (
        "matmul", 8, 4, 16, 1)
    x, w = torch.ones(2, 8, 9, 9), torch.ones(6, 4, 3, 3)       # 2 groups, stride 2
    out = torch.nn.functional.conv2d(x, w, stride=2, groups=2)
    shape = kernel_shape(aten.convolution.default,
                         (x, w, None, [2, 2], [0, 0], [1, 1], False, [0, 0], 2), out)
    assert shape == ("conv", 2 * 4 * 4, 3, 4 * 9, 2)
    _, m, n, k, count = shape                                    # the FLOPs of the conv
    assert 2 * m * n * k * count == 2 * out.numel() * 4 * 9
    transposed = (x, w, None, [1, 1], [0, 0], [1, 1], True, [0, 0], 1)
    assert kernel_shape(aten.convolution.default, transposed, out) is None
    assert kernel_shape(aten.add.Tensor, (a, a), a) is None


class _Convs(torch.nn.Module):
    """3x3, grouped 1x1 and strided convolutions, a linear layer: every kernel class."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.b = torch.nn.Conv2d(8, 8, 1, groups=2)
        self.c = torch.nn.Conv2d(8, 4, 3, stride=2)
        self.fc = torch.nn.Linear(4 * 3 * 3, 5)

    def forward(self, x):
        return self.fc(self.c(self.b(self.a(x)).relu()).flatten(1))


@pytest.mark.parametrize("model", ["convs", "gpt2"])
def test_captured_kernels_add_up_to_the_expensive_flops(model):
    if model == "gpt2":
        g = memflow.zoo.graph("gpt2", batch_size=2, units="blocks", n_layer=1, hidden=32,
                              n_head=2, vocab=50, seq_len=8)
    else:
        g = memflow.from_torch(_Convs(), torch.ones(2, 3, 8, 8))
        assert [r[0] for cell in g.units["kernels"] for r in cell] == [
            "conv", "conv1x1", "conv", "matmul"]
    flops = g.units["kernels"].map(lambda cell: sum(2 * m * n * k * c for _, m, n, k, c in cell))
    assert np.allclose(flops, g.units["expensive_fwd_flops"])
    assert {r[0] for cell in g.units["kernels"] for r in cell} <= set(KERNEL_CLASSES)
    assert OpGraph.from_dict(g.to_dict()).units["kernels"].tolist() == g.units["kernels"].tolist()


def test_kernels_column_is_checked_and_optional():
    units = {"fwd_flops": [1.0, 2.0], "bwd_flops": [2.0, 4.0]}
    tensors = {"bytes": [8], "producer": ["a"], "consumers": [["b"]]}
    g = OpGraph(pd.DataFrame(units, index=["a", "b"]), pd.DataFrame(tensors))
    assert g.units["kernels"].tolist() == [[], []]
    bad = pd.DataFrame(units | {"kernels": [[["gemm", 1, 2, 3, 1]], []]}, index=["a", "b"])
    with pytest.raises(GraphError, match=r"unit 'a': kernels .*'matmul'"):
        OpGraph(bad, pd.DataFrame(tensors))


def test_grid_classes_are_the_kernel_classes_and_tiny_grid_is_measured():
    assert {s[0] for grid in kernels.GRID.values() for s in grid} == set(KERNEL_CLASSES)
    table = kernels.measure_grid("tiny", lambda call: (1e-3, 1e-3))
    assert [r[:4] for r in table["one"]] == [list(s) for s in kernels.GRID["tiny"]]
    # the fake timer's 1 ms per call: rates are the FLOPs per ms, backward twice the FLOPs
    flops = [kernels.grid_kernel(s, 1)[0] for s in kernels.GRID["tiny"]]
    assert [r[4] for r in table["cpu"]] == [f / 1e-3 for f in flops]
    assert [r[5] for r in table["cpu"]] == [2 * f / 1e-3 for f in flops]


def test_class_rates_exact_on_the_grid_monotone_between_and_nan_without_class():
    table = [["conv1x1", 32, 256, 256, 5e9, 4e9], ["conv1x1", 2048, 256, 256, 40e9, 30e9]]
    m = [32, 128, 512, 2048]
    fwd, bwd = kernels.class_rates(table, ["conv1x1"] * 4, m, [256] * 4, [256] * 4)
    assert fwd[0] == 5e9 and fwd[-1] == 40e9 and bwd[0] == 4e9
    assert np.all(np.diff(fwd) > 0)
    assert np.isclose(fwd[1] * fwd[2], 5e9 * 40e9)       # symmetric in log-size
    assert np.isnan(kernels.class_rates(table, ["matmul"], [8], [8], [8])[0][0])


def _thin_and_wide(rate_small: float):
    """A local CPU whose matrix products of few rows run at ``rate_small``, of many at 30e9."""
    f = {**EXAMPLE_FIGURES, "kernel_rates": {
        c: [["matmul", 2, 64, 64, rate_small, rate_small], ["matmul", 512, 64, 64, 30e9, 30e9]]
        for c in ("one", "cpu")}}
    return local_cluster(f, 1, threads=1)


def test_cpu_time_follows_the_shape_class_and_gpus_ignore_it():
    g = memflow.zoo.graph("chain", batch_size=2, n=3, width=64)
    s = memflow.Strategy.data_parallel(g, ["cpu0"])
    slow, fast = (memflow.simulate(g, s, _thin_and_wide(r)).iteration_time for r in (1e9, 30e9))
    assert slow > fast
    flops = float(g.units["fwd_flops"].sum() + g.units["bwd_flops"].sum())
    assert slow - fast > 0.5 * flops * (1 / 1e9 - 1 / 30e9)     # the kernels' share, at least
    # without the table: the previous model (one rate per op class), whatever the shapes
    doc = _thin_and_wide(1e9).to_dict()
    for d in doc["devices"]:
        del d["kernel_rates"]
    by_flops = memflow.simulate(g, s, memflow.Cluster.from_dict(doc)).iteration_time
    assert by_flops not in (slow, fast)
    # the datasheet GPU path reads no shapes: the same time with or without them
    gpu = memflow.Cluster.preset("1xV100-16GB")
    sg = memflow.Strategy.data_parallel(g, list(gpu.devices.index))
    bare = OpGraph(g.units.drop(columns="kernels"), g.tensors, g.meta, parameters=g.parameters)
    assert (memflow.simulate(g, sg, gpu).iteration_time
            == memflow.simulate(bare, sg, gpu).iteration_time)


def test_shared_cores_share_the_shape_class_rates():
    one = local_cluster(EXAMPLE_FIGURES, 1, threads=1).devices.loc["cpu0", "kernel_rates"]
    four = local_cluster(EXAMPLE_FIGURES, 4).devices.loc["cpu0", "kernel_rates"]
    assert [r[4] / 2 for r in json.loads(one)] == [r[4] for r in json.loads(four)]
