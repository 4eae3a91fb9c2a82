"""Backend rules: CPU's checked against real CPU kernels, CUDA's against PyTorch's stated rules."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from memflow.errors import CaptureError
from memflow.graph.backend import (BACKENDS, Backend, cuda_sdpa_kernel, get_backend,
                                   onednn_lstm_workspace, register_backend)
from memflow.graph.capture import from_torch
from memflow.graph.measure import saved_bytes


def real_workspace(steps, batch, input_size, hidden, dtype=torch.float32):
    lstm = nn.LSTM(input_size, hidden).to(dtype)
    found = []

    def pack(t):
        if t.dtype == torch.uint8:
            found.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        lstm(torch.randn(steps, batch, input_size, dtype=dtype))
    if not found:      # this CPU runs the LSTM without oneDNN (e.g. bf16 on CPUs without it)
        pytest.skip(f"oneDNN does not run a {dtype} LSTM on this CPU: no workspace to compare")
    return found[0]


@pytest.mark.parametrize("steps, batch, input_size, hidden", [
    (5, 3, 8, 16), (1, 1, 1, 1), (17, 33, 100, 50), (40, 3, 1, 1024), (2, 64, 300, 256),
    (7, 128, 8, 128)])
def test_onednn_lstm_workspace_is_what_cpu_allocates(steps, batch, input_size, hidden):
    assert onednn_lstm_workspace(steps, batch, input_size, hidden) == \
        real_workspace(steps, batch, input_size, hidden)


def test_onednn_lstm_workspace_in_bfloat16():
    assert onednn_lstm_workspace(7, 33, 100, 300, itemsize=2) == \
        real_workspace(7, 33, 100, 300, torch.bfloat16)


class Drop(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.drop = nn.Linear(16, 16), nn.Dropout(0.1)

    def forward(self, x):
        return self.drop(self.lin(x))


@pytest.mark.parametrize("backend, mask_bytes, dtype", [("cpu", 4, "float32"),
                                                         ("cuda", 1, "bool")])
def test_dropout_mask_by_backend(backend, mask_bytes, dtype):
    x = torch.randn(8, 16)
    g = from_torch(Drop(), x, backend=backend)
    assert g.units.loc["drop", "saved_bytes"] == x.numel() * mask_bytes
    saved = g.tensors[g.tensors["first_saver"] == "drop"]
    assert saved["dtype"].tolist() == [dtype]


class Attend(nn.Module):
    def __init__(self, mask: bool = False):
        super().__init__()
        self.mask = mask

    def forward(self, q, k, v):
        s = q.shape[2]
        m = torch.ones(s, s, dtype=torch.bool, device=q.device).tril() if self.mask else None
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=not self.mask)


def qkv(b=2, h=4, s=128, d=64, dtype=torch.float16):
    return tuple(torch.empty(b, h, s, d, dtype=dtype, device="meta", requires_grad=True)
                 for _ in range(3))


@pytest.mark.parametrize("dtype, kernel, lse_len", [(torch.float16, "flash", 128),
                                                    (torch.float32, "efficient", 128)])
def test_cuda_fused_attention_saves_log_sum_exp_not_probabilities(dtype, kernel, lse_len):
    q, k, v = qkv(dtype=dtype)
    assert cuda_sdpa_kernel(q, k, None) == kernel
    g = from_torch(Attend(), (q, k, v), backend="cuda")
    t = g.tensors[g.tensors["savers"].map(bool)]
    lse = t[t["dtype"] == "float32"] if dtype == torch.float16 else t[t["shape"].map(len) == 3]
    assert lse["shape"].tolist() == [[2, 4, lse_len]]
    assert not any(shape[-2:] == [128, 128] for shape in t["shape"])  # no s x s tensor kept


def test_cuda_efficient_attention_pads_its_log_sum_exp_and_mask():
    q, k, v = qkv(s=40)
    assert cuda_sdpa_kernel(q, k, torch.ones(40, 40, dtype=torch.bool)) == "efficient"
    g = from_torch(Attend(mask=True), (q, k, v), backend="cuda")
    shapes = g.tensors.loc[g.tensors["savers"].map(bool), "shape"].tolist()
    assert [2, 4, 64] in shapes                          # log-sum-exp, padded to 32 rows
    assert [2, 4, 40, 48] in shapes                      # the float bias, padded to 16


def test_cpu_attention_uses_cpu_flash_unless_dropout():
    q, k, v = qkv(dtype=torch.float32)
    g = from_torch(Attend(), (q, k, v))
    assert [2, 4, 128] in g.tensors["shape"].tolist()                 # CPU flash's lse
    assert g.units["saved_bytes"].sum() == 4 * (4 * 2 * 4 * 128 * 64) + 4 * 2 * 4 * 128


class MathAttend(nn.Module):
    """What CUDA runs for grouped float32 heads, called by name on real CPU tensors."""

    def forward(self, q, k, v):
        return torch.ops.aten._scaled_dot_product_attention_math(q, k, v, None, 0.0, True,
                                                                  enable_gqa=True)[0]


class GroupedAttend(nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def test_cuda_math_attention_saves_probabilities_and_repeated_heads_not_cpu_flash():
    # on an H200 a float32 grouped-query Llama held 13 GB more than a capture that let CPU's
    # dispatcher pick its flash kernel: CUDA's math path keeps the s x s probabilities
    q = torch.randn(2, 4, 64, 32, requires_grad=True)
    k, v = (torch.randn(2, 2, 64, 32, requires_grad=True) for _ in range(2))
    assert cuda_sdpa_kernel(q, k, None, enable_gqa=True) == "math"
    g = from_torch(GroupedAttend(), (q, k, v), backend="cuda")
    assert g.units["saved_bytes"].sum() == saved_bytes(MathAttend(), (q, k, v))
    assert g.units["saved_bytes"].sum() > 4 * 2 * 4 * 64 * 64      # the probabilities


def test_cuda_sdpa_kernel_choice():
    half, single = qkv(d=64)[0], qkv(d=64, dtype=torch.float32)[0]
    odd = qkv(d=20, dtype=torch.float32)[0]
    assert cuda_sdpa_kernel(half, half, None) == "flash"
    assert cuda_sdpa_kernel(qkv(d=512)[0], qkv(d=512)[0], None) == "efficient"
    assert cuda_sdpa_kernel(single, single, None) == "efficient"
    assert cuda_sdpa_kernel(odd, odd, None) == "math"
    grouped = qkv(h=2)[0]
    # Flash reads grouped key/value heads (PyTorch's sdp_utils: "supports GQA"); efficient
    # attention does not, so grouped float32 heads take the math path.
    assert cuda_sdpa_kernel(half, grouped, None, enable_gqa=True) == "flash"
    assert cuda_sdpa_kernel(single, qkv(h=2, dtype=torch.float32)[0], None,
                            enable_gqa=True) == "math"
    assert cuda_sdpa_kernel(single, single, None, enable_gqa=True) == "efficient"


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.norm = nn.Linear(16, 16), nn.LayerNorm(16)

    def forward(self, x):
        return self.norm(self.fc(x)).softmax(-1)


@pytest.mark.parametrize("backend, norm_dtype, glue_dtype", [
    ("cpu", "float16", "float16"),         # CPU autocast keeps LayerNorm and softmax in half
    ("cuda", "float32", "float32")])       # CUDA's lists run them in float32
def test_autocast_follows_the_backends_op_lists(backend, norm_dtype, glue_dtype):
    g = from_torch(Block(), torch.randn(4, 16), backend=backend, autocast="float16")
    assert g.units.loc["fc", "dtype"] == "float16"
    assert g.units.loc["norm", "dtype"] == norm_dtype
    assert g.units.loc["<root>", "dtype"] == glue_dtype


def test_cuda_autocast_casts_a_shared_weight_once():
    lin = nn.Linear(16, 16)
    model = nn.Sequential(lin, nn.ReLU(), lin)
    g = from_torch(model, torch.randn(4, 16), backend="cuda", autocast="float16")
    casts = g.tensors[(g.tensors["dtype"] == "float16") & (g.tensors["shape"].map(
        lambda s: s == [16, 16]))]
    assert len(casts) == 1 and not casts["per_sample"].any()


def test_registry():
    assert set(BACKENDS) >= {"cpu", "cuda"}
    assert get_backend(BACKENDS["cuda"]) is BACKENDS["cuda"]
    custom = register_backend(Backend("cpu-no-onednn", "CPU without oneDNN", mkldnn=False))
    try:
        assert get_backend("cpu-no-onednn") is custom
        with pytest.raises(CaptureError, match="'cpu', 'cpu-no-onednn', 'cuda'"):
            get_backend("gpu")
    finally:
        del BACKENDS["cpu-no-onednn"]
    with pytest.raises(CaptureError, match="needs a Backend"):
        register_backend("cpu")
