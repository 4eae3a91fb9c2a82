"""Small real models for the capture tests: one per structure capture must get right, and a
check of a graph's parameters table against the real model."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from memflow.graph import OpGraph


class Residual(nn.Module):
    """Conv-BN-ReLU(inplace) twice with a skip connection added in place."""

    def __init__(self, c: int = 8):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))
        y += x
        return self.relu(y)


class ResNetish(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.blocks = nn.Sequential(Residual(), Residual())
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.blocks(self.stem(x))), 1))


class Branches(nn.Module):
    """Inception-like: four branches of one input, concatenated."""

    def __init__(self, c: int = 8):
        super().__init__()
        self.b1 = nn.Conv2d(c, 4, 1)
        self.b3 = nn.Sequential(nn.Conv2d(c, 4, 1), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1))
        self.b5 = nn.Sequential(nn.Conv2d(c, 2, 1), nn.ReLU(), nn.Conv2d(2, 4, 5, padding=2))
        self.pool = nn.Sequential(nn.MaxPool2d(3, 1, 1), nn.Conv2d(c, 4, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(torch.cat([self.b1(x), self.b3(x), self.b5(x), self.pool(x)], 1))


class Inceptionish(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.mixed_a, self.mixed_b = Branches(), Branches(16)
        self.fc = nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.mixed_b(self.mixed_a(self.stem(x))).mean((2, 3)))


class Recurrent(nn.Module):
    def __init__(self, cell: type = nn.LSTM, bidirectional: bool = False):
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.rnn = cell(16, 24, num_layers=2, batch_first=True, dropout=0.1,
                        bidirectional=bidirectional)
        self.head = nn.Linear(48 if bidirectional else 24, 50)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(self.embed(ids))[0])


class Attention(nn.Module):
    """Self-attention, explicit (softmax, dropout) or through scaled_dot_product_attention."""

    def __init__(self, hidden: int = 32, heads: int = 4, sdpa: bool = False,
                 mask: bool = False, dropout: float = 0.1):
        super().__init__()
        self.heads, self.sdpa, self.use_mask = heads, sdpa, mask
        self.qkv, self.out = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        mask = torch.ones(s, s, dtype=torch.bool, device=x.device).tril() if self.use_mask \
            else None
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                               dropout_p=self.drop.p if self.training else 0.0,
                                               is_causal=not self.use_mask)
        else:
            att = q @ k.transpose(-1, -2) / (h // self.heads) ** 0.5
            if mask is not None:
                att = att.masked_fill(~mask, float("-inf"))
            y = self.drop(att.softmax(-1)) @ v
        return self.out(y.transpose(1, 2).reshape(b, s, h))


class TiedInplace(nn.Module):
    """Embedding and output layer share one weight; glue modifies a tensor in place."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.norm = nn.LayerNorm(16)
        self.head = nn.Linear(16, 50, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        x.mul_(2.0)
        x = torch.tanh(x).add_(1.0)
        return self.head(self.norm(x))


def hf_gpt2() -> tuple[nn.Module, torch.Tensor]:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=64)
    return GPT2LMHeadModel(config).train(), torch.randint(0, 100, (2, 16))


def hf_bert() -> tuple[nn.Module, dict]:
    from transformers import BertConfig, BertModel

    config = BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                        intermediate_size=128, vocab_size=100)
    ids = torch.randint(0, 100, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, 12:] = 0
    return BertModel(config).train(), {"input_ids": ids, "attention_mask": mask}


CASES = {
    "residual": lambda: (ResNetish(), torch.randn(2, 3, 16, 16)),
    "branching": lambda: (Inceptionish(), torch.randn(2, 3, 12, 12)),
    "lstm": lambda: (Recurrent(nn.LSTM), torch.randint(0, 50, (3, 7))),
    "lstm-bidirectional": lambda: (Recurrent(nn.LSTM, True), torch.randint(0, 50, (3, 7))),
    "gru": lambda: (Recurrent(nn.GRU), torch.randint(0, 50, (3, 7))),
    "attention": lambda: (Attention(mask=True), torch.randn(2, 10, 32)),
    "sdpa-causal": lambda: (Attention(sdpa=True, dropout=0.0), torch.randn(2, 10, 32)),
    "sdpa-mask": lambda: (Attention(sdpa=True, mask=True, dropout=0.0), torch.randn(2, 10, 32)),
    "sdpa-dropout": lambda: (Attention(sdpa=True), torch.randn(2, 10, 32)),
    "tied-inplace": lambda: (TiedInplace(), torch.randint(0, 50, (3, 7))),
    "hf-gpt2": hf_gpt2,
    "hf-bert": hf_bert,
}
"""Name -> builder of ``(model, example_inputs)``, real CPU tensors, training mode."""


def assert_matches_model(g: OpGraph, model: nn.Module) -> None:
    """One row per parameter/buffer storage, under all its names, with its real size."""
    named = {**dict(model.named_parameters(remove_duplicate=False)),
             **dict(model.named_buffers(remove_duplicate=False))}
    assert sorted(n for names in g.parameters["names"] for n in names) == sorted(named)
    for row in g.parameters.itertuples():
        t = named[row.name]
        assert all(named[n] is t for n in row.names)
        assert (row.bytes, row.numel) == (t.untyped_storage().nbytes(), t.numel())
        assert row.trainable == (t.requires_grad and not row.is_buffer)
    sums = g.units[["params", "param_bytes", "buffer_bytes"]].sum().tolist()
    assert sums == [sum(p.numel() for p in model.parameters()),
                    sum(p.untyped_storage().nbytes() for p in model.parameters()),
                    sum(b.untyped_storage().nbytes() for b in model.buffers())]
