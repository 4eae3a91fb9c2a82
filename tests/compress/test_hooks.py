"""Compressed saved tensors inside a real autograd backward."""
import pytest
import torch

from memflow.compress import compress, compressed_saved_tensors, decompress
from memflow.errors import CompressionError


def grads(model, x, hooks=None):
    # a fixed random projection: mean(y²) after a BatchNorm has an identically zero gradient
    model.zero_grad(set_to_none=True)
    w = torch.randn(model(x).shape, generator=torch.Generator().manual_seed(9))
    if hooks is None:
        loss = (model(x) * w).sum()
    else:
        with hooks:
            loss = (model(x) * w).sum()
    loss.backward()
    return {k: p.grad.clone() for k, p in model.named_parameters()}


def test_linear_weight_gradient_error_is_bounded_by_the_bound():
    # dW = g^T x: with x̂ saved instead of x, |dW - dŴ| <= eb · sum_n |g[n, i]| element-wise
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 16)
    x = torch.randn(128, 64) * 3
    g = torch.randn(128, 16)
    eb = 1e-2
    ref = torch.autograd.grad(lin(x), lin.weight, g)[0]
    with compressed_saved_tensors(eb) as hooks:
        y = lin(x)
    got = torch.autograd.grad(y, lin.weight, g)[0]
    bound = eb * g.abs().sum(0)[:, None]
    assert hooks.tensors == 1 and hooks.ratio > 2.5  # 11-bit codes over ±13
    assert ((got - ref).abs() <= bound * (1 + 1e-5) + 1e-6).all()
    assert not torch.equal(got, ref)  # it really went through the compressed copy


@pytest.mark.parametrize("eb", [1e-2, 1e-3, 1e-4])
def test_cnn_gradients_approach_the_exact_ones_as_the_bound_shrinks(eb):
    torch.manual_seed(1)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.GELU(),
        torch.nn.Flatten(), torch.nn.Linear(8 * 8 * 8, 10))
    x = torch.randn(16, 3, 16, 16)
    ref = grads(net, x)
    got = grads(net, x, compressed_saved_tensors(eb))
    for name in ref:
        if name == "0.bias":  # a bias before BatchNorm has no gradient: compare absolutely
            assert (got[name] - ref[name]).abs().max() < 1e-3
            continue
        rel = (got[name] - ref[name]).norm() / ref[name].norm()
        assert rel < 30 * eb, (name, float(rel))


def test_transformer_layer_trains_through_compressed_activations():
    torch.manual_seed(2)
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    x = torch.randn(4, 12, 32)
    ref = grads(layer, x)
    hooks = compressed_saved_tensors(1e-3, relative=True)
    got = grads(layer, x, hooks)
    assert hooks.tensors > 5 and hooks.ratio > 2
    for name in ref:
        assert (got[name] - ref[name]).norm() <= 0.02 * ref[name].norm(), name


class Recording(compressed_saved_tensors):
    """Also records what autograd offered and whether it was compressed."""

    def __init__(self, *args, **kwargs):
        self.offered = []
        super().__init__(*args, **kwargs)

    def _pack(self, t):
        out = super()._pack(t)
        self.offered.append((t.dtype, tuple(t.shape), out is not t))
        return out


def test_parameters_integer_tensors_and_small_tensors_are_left_alone():
    lin = torch.nn.Linear(100, 100)
    emb = torch.nn.Embedding(50, 100)
    tokens = torch.randint(50, (4, 100))
    small = torch.randn(3, requires_grad=True)
    with Recording(1e-3, min_numel=1000) as hooks:
        y = lin(emb(tokens)).sum() + (small ** 2).sum()
    y.backward()
    offered = {(dtype, shape): packed for dtype, shape, packed in hooks.offered}
    assert offered[(torch.int64, (4, 100))] is False          # token ids: kept
    assert offered[(torch.float32, (100, 100))] is False      # weight.t() of the Linear: kept
    assert offered[(torch.float32, (3,))] is False            # below min_numel: kept
    assert offered[(torch.float32, (400, 100))] is True       # the activation: compressed
    assert hooks.tensors == 1 and hooks.skipped == len(hooks.offered) - 1
    assert lin.weight.grad is not None and emb.weight.grad is not None


def test_a_storage_saved_twice_is_compressed_once():
    x = torch.randn(64, 64, requires_grad=True)
    with compressed_saved_tensors(1e-3) as hooks:
        y = torch.relu(x)        # saves its result
        z = (y * y).sum()        # saves y twice (both operands)
    z.backward()
    assert hooks.tensors == 1
    assert ((x.grad - 2 * torch.relu(x.detach()) * (x.detach() > 0)).abs() <= 2e-3 + 1e-6).all()


def test_skip_list_and_bad_bound():
    a = torch.randn(32, 32, requires_grad=True)
    b = torch.randn(32, 32, requires_grad=True)
    with compressed_saved_tensors(1e-2, skip=[a, b]) as hooks:
        (a @ b).sum().backward()
    assert hooks.tensors == 0 and hooks.skipped == 2
    with pytest.raises(CompressionError, match="error_bound must be a finite number > 0"):
        compressed_saved_tensors(0.0)


def test_packed_tensor_keeps_device_and_survives_inplace_changes_of_the_source():
    x = torch.randn(1000)
    p = compress(x, 1e-3)
    snapshot = decompress(p).clone()
    x.add_(5)
    assert torch.equal(decompress(p), snapshot)
    assert decompress(p).device == x.device
