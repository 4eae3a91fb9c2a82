"""Llama-style decoders: TinyLlama-1.1B and Llama-2 7B, 13B and 70B, in plain torch.

The decoder (:class:`Llama`) is written op by op as Hugging Face's ``LlamaForCausalLM`` runs
eagerly on real tensors, so that what autograd saves is what a real training step keeps:

* :class:`RMSNorm` as ``x * rsqrt(mean(x²) + eps)`` in float32 times ``weight`` (no fused
  ``rms_norm``): it saves its input, the inverse root and the normalised input;
* :class:`Rotary` makes ``cos`` and ``sin`` (``1 / theta^(2i/d)`` frequencies, each half
  repeated) from the positions once per forward, shared by every layer, as Hugging Face's
  ``rotary_emb`` does; a layer rotates q and k as ``x * cos + rotate_half(x) * sin``;
* :class:`Attention` has bias-free ``q_proj``, ``k_proj``, ``v_proj`` and ``o_proj``, with
  ``n_kv_head`` key/value heads shared by groups of query heads (grouped-query attention,
  Ainslie et al. 2023; ``n_kv_head == n_head`` is ordinary multi-head attention). It calls
  ``scaled_dot_product_attention(..., is_causal=True, enable_gqa=True)``, which is what
  Hugging Face's default ``sdpa`` attention calls when no padding mask is given: keys and
  values are *not* copied to every query head (``repeat_kv`` runs only on its explicit-mask
  path, and on fake or meta tensors, where it decides it is tracing). CPU flash attention
  (and CUDA flash attention) read the shared heads directly and save q, the ``n_kv_head``
  keys and values, the output and a log-sum-exp;
* :class:`MLP` is SwiGLU: ``down_proj(silu(gate_proj(x)) * up_proj(x))``, bias-free;
* both declare ``tp_plan`` (Megatron's tensor parallelism, :mod:`memflow.export.tensor_parallel`):
  q, k, v by heads, gate and up by ffn rows, column-parallel; o and down row-parallel;
* each :class:`DecoderLayer` is pre-norm: ``x + attn(input_layernorm(x))`` then
  ``x + mlp(post_attention_layernorm(x))``. No dropout (Llama trains without it).

:class:`Llama` holds ``embed_tokens``, the layers in the ``nn.ModuleList`` ``layers``, the final
``norm`` and an *untied* ``lm_head``; ``forward(ids)`` returns logits ``(batch, seq, vocab)``.
There is no learned position table, so any ``seq_len`` runs; the default is the published
context length.

Counts (summed from the architecture, every weight once; equal to Hugging Face's on the
released configurations): ``tinyllama-1.1b`` 1,100,048,384 (hidden 2048, 22 layers, 32 heads,
4 key/value heads, ffn 5632; Zhang et al. 2024, TinyLlama-1.1B); ``llama2-7b`` 6,738,415,616
(4096, 32, 32 heads, ffn 11008), ``llama2-13b`` 13,015,864,320 (5120, 40, 40 heads, ffn 13824),
``llama2-70b`` 68,976,648,192 (8192, 80, 64 heads, 8 key/value heads, ffn 28672); vocabulary
32,000, RMSNorm eps 1e-5, rotary theta 10,000 (Touvron et al., "Llama 2", 2023).

:data:`TINY` shrinks any of them to a real CPU step of milliseconds, keeping the grouped
key/value heads (the tests use it).

>>> model = Llama(**{**LLAMA2_7B, **TINY_ARCH})
>>> model(torch.randint(0, TINY_ARCH["vocab"], (2, 8))).shape
torch.Size([2, 8, 97])
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ..errors import MemflowError
from .spec import ModelSpec, token_inputs

__all__ = ["RMSNorm", "Rotary", "Attention", "MLP", "DecoderLayer", "Llama", "SPECS", "TINY",
           "TINY_ARCH", "LLAMA2_7B"]


class RMSNorm(nn.RMSNorm):
    """Root-mean-square norm in float32, scaled by a learned ``weight`` (no bias, no mean):
    ``nn.RMSNorm``'s weight, Hugging Face's ops (no fused ``rms_norm``). Being an
    ``nn.RMSNorm``, export's tensor parallelism knows it for a normalization (replicated)."""

    def __init__(self, hidden: int, eps: float):
        super().__init__(hidden, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Rotary(nn.Module):
    """``cos`` and ``sin`` of the rotary angles ``position / theta^(2i/head_dim)``."""

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.arange(seq_len, device=x.device, dtype=torch.float32)
        angles = torch.outer(positions, self.inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos().to(x.dtype), angles.sin().to(x.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of ``x`` (batch, heads, seq, head_dim): ``x cos + rotate_half(x) sin``.

    >>> x = torch.ones(1, 1, 1, 4)
    >>> rotate(x, torch.ones(1, 4), torch.zeros(1, 4)).flatten().tolist()
    [1.0, 1.0, 1.0, 1.0]
    """
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    """Causal grouped-query attention with rotary q and k; bias-free projections."""

    def __init__(self, hidden: int, n_head: int, n_kv_head: int):
        super().__init__()
        if hidden % n_head or n_head % n_kv_head:
            raise MemflowError(
                f"Llama attention: hidden={hidden} must be divisible by n_head={n_head} and "
                f"n_head by n_kv_head={n_kv_head}; choose n_kv_head among the divisors of "
                f"{n_head}")
        self.n_head, self.n_kv_head, self.head_dim = n_head, n_kv_head, hidden // n_head
        self.q_proj = nn.Linear(hidden, n_head * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, n_kv_head * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, n_kv_head * self.head_dim, bias=False)
        self.o_proj = nn.Linear(n_head * self.head_dim, hidden, bias=False)

    # Tensor parallelism by heads (memflow.export.tensor_parallel, Megatron): the forward
    # reads the head counts from the widths the projections return, as torchtitan's does.
    tp_plan = {"q_proj": "colwise-sharded", "k_proj": "colwise-sharded",
               "v_proj": "colwise-sharded", "o_proj": "rowwise"}

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           enable_gqa=self.n_kv_head != self.n_head)
        return self.o_proj(y.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    """SwiGLU feed-forward: ``down_proj(silu(gate_proj(x)) * up_proj(x))``."""

    def __init__(self, hidden: int, ffn: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, ffn, bias=False)
        self.up_proj = nn.Linear(hidden, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, hidden, bias=False)
        self.act = nn.SiLU()

    # Tensor parallelism (memflow.export.tensor_parallel, Megatron): gate and up split by
    # their ffn rows, down by the matching input columns (its output all-reduced).
    tp_plan = {"gate_proj": "colwise-sharded", "up_proj": "colwise-sharded",
               "down_proj": "rowwise"}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm attention and SwiGLU MLP, each added to the residual stream."""

    def __init__(self, hidden: int, n_head: int, n_kv_head: int, ffn: int, eps: float):
        super().__init__()
        self.input_layernorm = RMSNorm(hidden, eps)
        self.self_attn = Attention(hidden, n_head, n_kv_head)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.mlp = MLP(hidden, ffn)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    """Llama decoder with an untied head; ``forward(ids)`` -> logits (batch, seq, vocab)."""

    def __init__(self, vocab: int = 32000, hidden: int = 4096, n_layer: int = 32,
                 n_head: int = 32, n_kv_head: int | None = None, ffn: int = 11008,
                 eps: float = 1e-5, rope_theta: float = 10000.0):
        super().__init__()
        n_kv_head = n_head if n_kv_head is None else n_kv_head
        self.vocab = vocab
        self.embed_tokens = nn.Embedding(vocab, hidden)
        self.rotary = Rotary(hidden // n_head, rope_theta)
        self.layers = nn.ModuleList(DecoderLayer(hidden, n_head, n_kv_head, ffn, eps)
                                    for _ in range(n_layer))
        self.norm = RMSNorm(hidden, eps)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(ids)
        cos, sin = self.rotary(x, ids.shape[1])
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))


def _config(hidden: int, n_layer: int, n_head: int, n_kv_head: int, ffn: int) -> dict:
    return {"vocab": 32000, "hidden": hidden, "n_layer": n_layer, "n_head": n_head,
            "n_kv_head": n_kv_head, "ffn": ffn, "eps": 1e-5, "rope_theta": 10000.0}


LLAMA2_7B = _config(4096, 32, 32, 32, 11008)
# Options that shrink any Llama here to a CPU step of milliseconds, grouped heads kept.
TINY_ARCH = {"vocab": 97, "hidden": 32, "n_layer": 2, "n_head": 4, "n_kv_head": 2, "ffn": 48}
TINY = {**TINY_ARCH, "seq_len": 16}

_SOURCE = {"tinyllama-1.1b": "Zhang et al. 2024; TinyLlama/TinyLlama-1.1B (Llama 2 architecture)",
           "llama2-7b": "Touvron et al. 2023; meta-llama/Llama-2-7b-hf",
           "llama2-13b": "Touvron et al. 2023; meta-llama/Llama-2-13b-hf",
           "llama2-70b": "Touvron et al. 2023; meta-llama/Llama-2-70b-hf"}
_CONFIGS = {"tinyllama-1.1b": (_config(2048, 22, 32, 4, 5632), 2048),
            "llama2-7b": (LLAMA2_7B, 4096),
            "llama2-13b": (_config(5120, 40, 40, 40, 13824), 4096),
            "llama2-70b": (_config(8192, 80, 64, 8, 28672), 4096)}

SPECS = tuple(
    ModelSpec(name, "transformer", Llama, token_inputs, arch=arch, data={"seq_len": context},
              batch_size=8, input=f"token ids (batch, seq_len) int64; seq_len {context}",
              output="logits (batch, seq_len, vocab)", source=_SOURCE[name])
    for name, (arch, context) in _CONFIGS.items())
