"""SZ3 through pysz: the bound holds element-wise, zeros of ReLU maps stay zeros, and without
pysz everything falls back to memflow's quantizer."""
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from memflow.compress import choose, compress, compressed_saved_tensors, decompress, sz3
from memflow.compress import quantizer
from memflow.errors import CompressionError

from test_quantizer import check_round_trip, tensors, tracked_peak

needs_pysz = pytest.mark.skipif(not sz3.available(), reason="pysz (SZ3) is not installed: "
                                "pip install 'memflow[compress]'")


@pytest.fixture
def no_pysz(monkeypatch):
    """pysz made unimportable, as on a machine without it."""
    monkeypatch.setitem(sys.modules, "pysz", None)
    assert not sz3.available()


def relu_map(seed, shape=(8, 16, 12, 12), scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.relu(torch.randn(shape, generator=g) * scale)


@needs_pysz
@settings(max_examples=60, deadline=None)
@given(x=tensors(), log_eb=st.floats(-7, 1), relative=st.booleans())
def test_sz3_honours_the_bound_element_wise(x, log_eb, relative):
    eb = 10.0 ** log_eb
    packed = sz3.compress(x, eb, relative=relative)
    finite = x[torch.isfinite(x)].double()
    span = float(finite.max() - finite.min()) if finite.numel() else 0.0
    bound = eb * span if relative else eb
    assert packed.error_bound == pytest.approx(bound)
    check_round_trip(x, packed, bound, decompress)
    assert packed.nbytes <= packed.original_bytes + 32 + 12 * packed.outliers


@needs_pysz
@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2 ** 31 - 1), log_eb=st.floats(-5, 0), log_scale=st.floats(-2, 2))
def test_sz3_keeps_relu_zeros_and_the_bound(seed, log_eb, log_scale):
    eb, x = 10.0 ** log_eb, relu_map(seed, (4, 8, 10, 10), 10.0 ** log_scale)
    y = decompress(sz3.compress(x, eb))
    assert ((y - x).abs() <= eb).all()
    assert torch.equal(y > 0, x > 0)      # a ReLU's backward tests output > 0


@needs_pysz
def test_sz3_beats_the_quantizer_on_relu_maps_and_holds_its_exact_stream():
    x = relu_map(0, (8, 32, 28, 28))
    for eb in (1e-1, 1e-2, 1e-3):
        p, q = sz3.compress(x, eb), quantizer.compress(x, eb)
        assert p.compressor == "sz3" and p.shift > 0 and p.raw is None
        assert p.ratio > q.ratio, eb
        # the stream is a torch storage of exactly its size (what export's validation counts)
        assert p.stream.untyped_storage().nbytes() == p.stream.numel() < p.original_bytes


@needs_pysz
def test_sz3_16_bit_constant_and_tiny_maps():
    x = relu_map(1, (64, 64)).to(torch.bfloat16)
    y = decompress(sz3.compress(x, 1e-2))
    assert y.dtype == torch.bfloat16 and ((y.float() - x.float()).abs() <= 1e-2).all()
    c = sz3.compress(torch.full((10, 10), 3.25), 1e-3)
    assert c.compressor == "quantizer" and c.nbytes == 32      # no codes at all
    one = sz3.compress(torch.tensor([1.5, 2.5]), 1e-3)
    assert one.raw is not None and torch.equal(decompress(one), torch.tensor([1.5, 2.5]))


@needs_pysz
def test_default_is_sz3_on_cpu_and_hooks_train_through_it():
    assert choose("cpu") == "sz3" and choose("cuda") == "quantizer"
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    x = torch.randn(256, 32)
    with compressed_saved_tensors(1e-3) as hooks:
        loss = net(x).sum()
    loss.backward()
    assert hooks.tensors == 2 and hooks.ratio > 2


def test_without_pysz_the_quantizer_is_the_fallback(no_pysz):
    assert choose("cpu") == "quantizer"
    x = relu_map(2)
    p = compress(x, 1e-2)
    assert p.compressor == "quantizer" and ((decompress(p) - x).abs() <= 1e-2).all()
    with compressed_saved_tensors(1e-2) as hooks:
        torch.nn.functional.linear(x.view(-1, 12), torch.ones(3, 12, requires_grad=True))
    assert hooks.tensors == 1
    with pytest.raises(CompressionError, match=r"needs pysz.*pip install"):
        compress(x, 1e-2, compressor="sz3")
    with pytest.raises(CompressionError, match=r"needs pysz"):
        compressed_saved_tensors(1e-2, compressor="sz3")


def test_unknown_compressor_is_a_clear_error():
    with pytest.raises(CompressionError, match="compressor must be one of sz3, quantizer"):
        compress(torch.ones(8), 0.1, compressor="zfp")


@needs_pysz
def test_sz3_holds_one_map_decompressing_and_little_scratch_compressing():
    """Backward unpacks a saved map node by node, and the memory model charges the map
    itself: SZ3's decompression once held 3.5 maps (a shifted copy, a mask, a ``where``), so
    inception_v3's step under compress peaked 5% above the estimate."""
    x = relu_map(2, (4, 16, 128, 128))           # 4 MiB: several chunks
    packed, packing = tracked_peak(lambda: sz3.compress(x, 1e-2))
    y, unpacking = tracked_peak(lambda: decompress(packed))
    assert torch.equal(y == 0, x == 0) and ((y - x).abs() <= 1e-2).all()
    stream = packed.stream.numel()
    assert unpacking <= stream + 1.01 * packed.original_bytes
    # the map, its reconstruction to check the bound, the miss mask (1/4) and a chunk's
    # difference and masks: no more (it held 5.5 maps)
    assert packing <= stream + 2.25 * packed.original_bytes + 2 * 4 * sz3._CHUNK
