"""The Llama-style decoders: published counts from the architecture, grouped key/value heads,
an untied head, and a capture that saves what a real eager CPU step saves."""
import pytest
import torch

from memflow import zoo
from memflow.graph.capture import from_torch
from memflow.graph.measure import saved_bytes, saved_bytes_by_module
from memflow.zoo.llama import TINY

# (hidden, layers, heads, key/value heads, ffn) of the released configurations.
RELEASED = {"tinyllama-1.1b": (2048, 22, 32, 4, 5632), "llama2-7b": (4096, 32, 32, 32, 11008),
            "llama2-13b": (5120, 40, 40, 40, 13824), "llama2-70b": (8192, 80, 64, 8, 28672)}
PUBLISHED = {"tinyllama-1.1b": 1_100_048_384, "llama2-7b": 6_738_415_616,
             "llama2-13b": 13_015_864_320, "llama2-70b": 68_976_648_192}


def counted(hidden, n_layer, n_head, n_kv_head, ffn, vocab=32000):
    kv = hidden // n_head * n_kv_head
    layer = (2 * hidden * hidden + 2 * hidden * kv  # q, o; k, v
             + 3 * hidden * ffn                     # gate, up, down
             + 2 * hidden)                          # two RMSNorm weights
    return n_layer * layer + 2 * vocab * hidden + hidden  # embedding, untied head, final norm


@pytest.mark.parametrize("name", sorted(RELEASED))
def test_count_is_the_architectures_and_the_published_one(name):
    assert counted(*RELEASED[name]) == PUBLISHED[name]
    model, (ids,) = zoo.get(name, batch_size=1)     # on meta: 70B allocates nothing
    assert sum(p.numel() for p in model.parameters()) == PUBLISHED[name]
    assert all(p.is_meta for p in model.parameters())
    hidden, n_layer, n_head, n_kv_head, _ = RELEASED[name]
    attn = model.layers[0].self_attn
    assert len(model.layers) == n_layer and attn.n_kv_head == n_kv_head
    assert attn.k_proj.weight.shape == (hidden // n_head * n_kv_head, hidden)
    assert model.lm_head.weight is not model.embed_tokens.weight


@pytest.mark.parametrize("name", ["tinyllama-1.1b", "llama2-7b"])
def test_capture_saves_what_real_cpu_autograd_saves_per_module(name):
    model, inputs = zoo.get(name, batch_size=2, device="cpu", **TINY)
    graph = from_torch(model, inputs)
    captured = graph.units.groupby("module")["saved_bytes"].sum()
    assert captured[captured > 0].to_dict() == saved_bytes_by_module(model, inputs).to_dict()
    assert graph.units["saved_bytes"].sum() == saved_bytes(model, inputs)


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_grouped_heads_are_saved_once_not_per_query_head(backend):
    # Flash attention (CPU, and CUDA in 16-bit) reads the shared key/value heads: no
    # repeat_kv copy and no seq x seq probabilities are kept.
    b, s = 1, 256
    model, ids = zoo.get("llama2-70b", batch_size=b, n_layer=1, seq_len=s)
    graph = from_torch(model.to(torch.bfloat16), ids, backend=backend, units="blocks")
    saved = graph.tensors[graph.tensors["savers"].map(bool)]
    assert [b, 8, s, 128] in saved["shape"].tolist()        # rotated keys, 8 heads
    assert not any(shape[-2:] == [s, s] for shape in saved["shape"])


@pytest.mark.parametrize("autocast, dtype", [("bfloat16", torch.float32), (None, torch.bfloat16)])
def test_capture_matches_real_cpu_autograd_in_16_bit(autocast, dtype):
    # float32 RMSNorm inside a bf16 model, and CPU autocast's op lists
    model, inputs = zoo.get("tinyllama-1.1b", batch_size=2, device="cpu", **TINY)
    model = model.to(dtype)
    options = {"autocast": autocast} if autocast else {}
    assert (from_torch(model, inputs, **options).units["saved_bytes"].sum()
            == saved_bytes(model, inputs, **options))
