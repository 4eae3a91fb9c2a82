"""Op costs: formulas where torch has them, classes of ops otherwise, one warning per unknown op."""
import warnings

import torch

from memflow.graph.opcost import OpCounter

aten = torch.ops.aten


def test_views_and_allocations_cost_nothing():
    counter, x = OpCounter(), torch.ones(4, 4)
    view = counter.cost(aten.t.default, (x,), {}, x.t())
    assert (view.flops, view.bytes_moved, view.kernels) == (0, 0, 0)
    empty = counter.cost(aten.empty.memory_format, ([4],), {}, torch.empty(4))
    assert (empty.flops, empty.bytes_moved, empty.kernels) == (0, 0, 0)


def test_pointwise_reduction_and_normalization():
    counter, x = OpCounter(), torch.ones(8, 16)
    assert counter.cost(aten.relu.default, (x,), {}, x.relu()).flops == 128
    assert counter.cost(aten.sum.dim_IntList, (x, [1]), {}, x.sum(1)).flops == 128
    soft = counter.cost(aten._softmax.default, (x, 1, False), {}, x.softmax(1))
    assert soft.flops == 5 * 128 and soft.bytes_moved == 2 * 128 * 4


def test_matmuls_and_convolutions_use_torch_formulas():
    counter = OpCounter()
    a, b = torch.ones(8, 16), torch.ones(16, 4)
    assert counter.cost(aten.mm.default, (a, b), {}, a @ b).flops == 2 * 8 * 16 * 4
    x, w = torch.ones(1, 3, 8, 8), torch.ones(4, 3, 3, 3)
    out = torch.nn.functional.conv2d(x, w)
    args = (x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
    assert counter.cost(aten.convolution.default, args, {}, out).flops == 2 * out.numel() * 27


def test_unknown_ops_warn_once_each():
    counter, x = OpCounter(), torch.ones(4)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(3):
            assert counter.cost(aten.linalg_eigh.default, (torch.eye(4),), {},
                                torch.linalg.eigh(torch.eye(4))).flops == 0
    assert len(seen) == 1 and "aten.linalg_eigh" in str(seen[0].message)
    assert counter.uncounted == {"aten.linalg_eigh"}
