"""GPT-2 (small, medium, large, xl) and BERT (base, large) from one transformer block.

The block is written op by op, as Megatron-LM computes it, so that what autograd saves is
exactly what Korthikanti et al. ("Reducing activation recomputation in large transformer
models", 2022) count, ``sbh(34 + 5as/h)`` bytes per layer in 16-bit with 1-byte dropout masks:

* attention (:class:`SelfAttention`): one ``qkv`` Linear, ``q @ k^T`` times ``1/sqrt(d)``, the
  causal mask applied with ``masked_fill`` from a bool buffer ``mask`` built once per model and
  shared by the blocks (not per sample, not persistent), softmax, ``attn_dropout``, ``@ v``,
  the output projection ``proj`` and ``resid_dropout``; no ``scaled_dot_product_attention``,
  so no fused kernel hides what is saved;
* MLP (:class:`MLP`): ``fc`` h -> ffn, ``act`` GELU, ``proj`` ffn -> h, ``dropout``;
* LayerNorm before attention and before the MLP (GPT-2, pre-norm) or after each residual add
  (BERT, post-norm), named ``ln_1`` and ``ln_2``.

``dropout`` (default 0.1) sets the embedding, attention and residual dropouts together, as
Hugging Face's configs do. ``ffn``, the MLP's inner width, is ``4 * hidden`` unless given.

GPT-2 (:class:`GPT2`): token ``wte`` + position ``wpe`` embeddings, ``drop``, the blocks in the
``nn.ModuleList`` ``h``, final LayerNorm ``ln_f`` and the language-model head ``lm_head``, whose
weight *is* ``wte.weight`` (tied, counted once). GELU uses the tanh approximation, as GPT-2
does. ``forward(ids)`` returns logits ``(batch, seq, vocab)``. Counts, equal to Hugging Face's
``GPT2LMHeadModel``: gpt2 124,439,808; gpt2-medium 354,823,168; gpt2-large 774,030,080;
gpt2-xl 1,557,611,200. Source: Radford et al., "Language models are unsupervised multitask
learners" (2019), and the released configurations (n_embd / n_layer / n_head = 768/12/12,
1024/24/16, 1280/36/20, 1600/48/25; vocabulary 50,257; 1,024 positions).

BERT (:class:`BERT`): ``embeddings`` (word, position, token type — all type 0 —, LayerNorm,
dropout), the blocks in the ``nn.ModuleList`` ``layer``, then a head. The default head is
BERT's ``pooler`` (Linear + tanh on the first token): ``forward(ids)`` returns the pooled
representation ``(batch, hidden)`` that a classification head reads, and the count is
Hugging Face's ``BertModel`` (with pooler): bert-base 109,482,240; bert-large 335,141,888.
``head="mlm"`` replaces it with the masked-LM head (transform + decoder tied to the word
embeddings) and returns logits ``(batch, seq, vocab)``: the count of ``BertForMaskedLM``,
109,514,298 for bert-base. GELU is exact (erf), LayerNorm eps 1e-12. Source: Devlin et al.,
"BERT: pre-training of deep bidirectional transformers" (NAACL 2019), base 768/12/12 and large
1024/24/16, vocabulary 30,522, 512 positions, 2 token types.

The attention has no padding mask: every example sequence is full length.

>>> model = GPT2(vocab=100, max_positions=16, hidden=32, n_layer=2, n_head=4)
>>> model(torch.randint(0, 100, (2, 16))).shape
torch.Size([2, 16, 100])
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ..errors import MemflowError
from .spec import ModelSpec, token_inputs

__all__ = ["SelfAttention", "MLP", "Block", "GPT2", "BERT", "SPECS"]


class SelfAttention(nn.Module):
    """Multi-head self-attention, unfused; ``mask`` (True = hidden) makes it causal."""

    def __init__(self, hidden: int, n_head: int, dropout: float, mask: torch.Tensor | None):
        super().__init__()
        if hidden % n_head:
            raise MemflowError(f"hidden={hidden} is not divisible by n_head={n_head}; "
                               f"choose n_head among the divisors of {hidden}")
        self.n_head = n_head
        self.scale = 1.0 / math.sqrt(hidden // n_head)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.attn_dropout = nn.Dropout(dropout)
        self.proj = nn.Linear(hidden, hidden)
        self.resid_dropout = nn.Dropout(dropout)
        self.register_buffer("mask", mask, persistent=False)

    # Tensor parallelism by heads (memflow.export.tensor_parallel, Megatron): each rank's
    # ``qkv`` holds the q, k and v rows of its heads, ``proj`` the matching input columns. The
    # forward reads the head count from the width ``qkv`` returns, as torchtitan's does.
    tp_plan = {"qkv": "colwise-qkv", "proj": "rowwise"}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = (t.view(b, s, -1, h // self.n_head).transpose(1, 2)
                   for t in self.qkv(x).chunk(3, dim=2))
        att = (q @ k.transpose(-2, -1)) * self.scale
        if self.mask is not None:
            att = att.masked_fill(self.mask[:s, :s], float("-inf"))
        att = self.attn_dropout(att.softmax(dim=-1))
        y = (att @ v).transpose(1, 2).reshape(b, s, -1)
        return self.resid_dropout(self.proj(y))


class MLP(nn.Module):
    """Position-wise feed-forward: Linear h -> ffn, GELU, Linear ffn -> h, dropout."""

    def __init__(self, hidden: int, ffn: int, dropout: float, gelu: str):
        super().__init__()
        self.fc = nn.Linear(hidden, ffn)
        self.act = nn.GELU(approximate=gelu)
        self.proj = nn.Linear(ffn, hidden)
        self.dropout = nn.Dropout(dropout)

    # Tensor parallelism (memflow.export.tensor_parallel, Megatron): fc by its ffn rows, proj
    # by the matching input columns (its output all-reduced).
    tp_plan = {"fc": "colwise-sharded", "proj": "rowwise"}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(self.act(self.fc(x))))


class Block(nn.Module):
    """Attention and MLP with residual adds; LayerNorm before each (``pre_norm``) or after."""

    def __init__(self, hidden: int, n_head: int, ffn: int, dropout: float, *,
                 mask: torch.Tensor | None, pre_norm: bool, gelu: str, eps: float):
        super().__init__()
        self.pre_norm = pre_norm
        self.ln_1 = nn.LayerNorm(hidden, eps=eps)
        self.attn = SelfAttention(hidden, n_head, dropout, mask)
        self.ln_2 = nn.LayerNorm(hidden, eps=eps)
        self.mlp = MLP(hidden, ffn, dropout, gelu)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pre_norm:
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))
        x = self.ln_1(x + self.attn(x))
        return self.ln_2(x + self.mlp(x))


class GPT2(nn.Module):
    """GPT-2 language model with a tied head; ``forward(ids)`` -> logits (batch, seq, vocab)."""

    def __init__(self, vocab: int = 50257, max_positions: int = 1024, hidden: int = 768,
                 n_layer: int = 12, n_head: int = 12, ffn: int | None = None,
                 dropout: float = 0.1):
        super().__init__()
        self.vocab, self.max_positions = vocab, max_positions
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = nn.Embedding(max_positions, hidden)
        self.drop = nn.Dropout(dropout)
        # One causal mask (True above the diagonal) for all blocks, made once per model:
        # a buffer, neither per sample nor per step.
        mask = torch.ones(max_positions, max_positions, dtype=torch.bool).triu(1)
        self.h = nn.ModuleList(
            Block(hidden, n_head, ffn or 4 * hidden, dropout, mask=mask, pre_norm=True,
                  gelu="tanh", eps=1e-5)
            for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(hidden, eps=1e-5)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.drop(self.wte(ids) + self.wpe(positions))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class BertEmbeddings(nn.Module):
    """Word + position + token-type embeddings, LayerNorm, dropout."""

    def __init__(self, vocab: int, max_positions: int, type_vocab: int, hidden: int,
                 dropout: float):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, hidden)
        self.position_embeddings = nn.Embedding(max_positions, hidden)
        self.token_type_embeddings = nn.Embedding(type_vocab, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=1e-12)
        self.dropout = nn.Dropout(dropout)
        # Every token is of type 0, as Hugging Face assumes when no types are given.
        self.register_buffer("token_type_ids", torch.zeros(max_positions, dtype=torch.long),
                             persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        s = ids.shape[1]
        positions = torch.arange(s, device=ids.device)
        x = (self.word_embeddings(ids) + self.position_embeddings(positions)
             + self.token_type_embeddings(self.token_type_ids[:s]))
        return self.dropout(self.LayerNorm(x))


class BERT(nn.Module):
    """BERT encoder with the pooler (``head="pooler"``) or the masked-LM head (``"mlm"``)."""

    HEADS = ("pooler", "mlm")

    def __init__(self, vocab: int = 30522, max_positions: int = 512, type_vocab: int = 2,
                 hidden: int = 768, n_layer: int = 12, n_head: int = 12,
                 ffn: int | None = None, dropout: float = 0.1, head: str = "pooler"):
        super().__init__()
        if head not in self.HEADS:
            raise MemflowError(f"BERT head={head!r} is unknown; valid: {', '.join(self.HEADS)}")
        self.vocab, self.max_positions, self.head = vocab, max_positions, head
        self.embeddings = BertEmbeddings(vocab, max_positions, type_vocab, hidden, dropout)
        self.layer = nn.ModuleList(
            Block(hidden, n_head, ffn or 4 * hidden, dropout, mask=None, pre_norm=False,
                  gelu="none", eps=1e-12)
            for _ in range(n_layer))
        if head == "pooler":
            self.pooler = nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh())
        else:
            self.transform = nn.Sequential(nn.Linear(hidden, hidden), nn.GELU(),
                                           nn.LayerNorm(hidden, eps=1e-12))
            self.decoder = nn.Linear(hidden, vocab)
            self.decoder.weight = self.embeddings.word_embeddings.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embeddings(ids)
        for block in self.layer:
            x = block(x)
        if self.head == "pooler":
            return self.pooler(x[:, 0])
        return self.decoder(self.transform(x))


def _gpt2(hidden: int, n_layer: int, n_head: int) -> dict:
    return {"vocab": 50257, "max_positions": 1024, "hidden": hidden, "n_layer": n_layer,
            "n_head": n_head, "ffn": None, "dropout": 0.1}


def _bert(hidden: int, n_layer: int, n_head: int) -> dict:
    return {"vocab": 30522, "max_positions": 512, "type_vocab": 2, "hidden": hidden,
            "n_layer": n_layer, "n_head": n_head, "ffn": None, "dropout": 0.1,
            "head": "pooler"}


_GPT2_SOURCE = "Radford et al. 2019; Hugging Face GPT2LMHeadModel ({})"
_BERT_SOURCE = "Devlin et al., NAACL 2019; Hugging Face BertModel with pooler ({})"
_GPT2_IO = {"input": "token ids (batch, seq_len) int64; seq_len 1024",
            "output": "logits (batch, seq_len, vocab)"}
_BERT_IO = {"input": "token ids (batch, seq_len) int64; seq_len 128",
            "output": "pooled [CLS] (batch, hidden); head='mlm': logits (batch, seq_len, vocab)"}

SPECS = tuple(
    ModelSpec(name, "transformer", GPT2, token_inputs, arch=_gpt2(*dims),
              data={"seq_len": 1024}, batch_size=8,
              source=_GPT2_SOURCE.format(name), **_GPT2_IO)
    for name, dims in (("gpt2", (768, 12, 12)), ("gpt2-medium", (1024, 24, 16)),
                       ("gpt2-large", (1280, 36, 20)), ("gpt2-xl", (1600, 48, 25)))
) + tuple(
    ModelSpec(name, "transformer", BERT, token_inputs, arch=_bert(*dims),
              data={"seq_len": 128}, batch_size=32,
              source=_BERT_SOURCE.format(hf), **_BERT_IO)
    for name, hf, dims in (("bert-base", "bert-base-uncased", (768, 12, 12)),
                           ("bert-large", "bert-large-uncased", (1024, 24, 16)))
)
