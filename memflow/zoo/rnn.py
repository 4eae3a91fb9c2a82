"""GNMT and BigLSTM: the recurrent models of Pal et al.'s hybrid-parallelism study.

**GNMT** (:class:`GNMT`) follows Wu et al., "Google's neural machine translation system"
(arXiv:1609.08144, 2016): an encoder of ``n_layer`` LSTM layers whose first is bidirectional,
a decoder of ``n_layer`` LSTM layers with attention, hidden size 1024, residual connections from
the third layer on, and dropout on the inputs of the LSTM layers. Its modules follow NVIDIA's
PyTorch "GNMT v2" (DeepLearningExamples ``PyTorch/Translation/GNMT``, the MLPerf reference,
by some of Pal et al.'s co-authors): one embedding shared by source and target over a 32,320
token BPE vocabulary; normalized Bahdanau attention whose query is the first decoder layer's
output and whose context is concatenated to the inputs of every later decoder layer; a Linear
classifier. NVIDIA's default is 4 layers a side, 160,671,297 parameters (``n_layer=4``
reproduces that count exactly); the default here is Wu et al.'s 8 a side, 244,622,913
parameters. Inputs ``(src_tokens, tgt_tokens)``, both ``(batch, 50)`` (MLPerf's maximum training
length), every sequence full length (no packing, no padding mask); ``forward`` returns
teacher-forced logits ``(batch, tgt_len, vocab)``.

**BigLSTM** (:class:`BigLSTM`) is the "BIGLSTM" language model of Kuchaiev & Ginsburg,
"Factorization tricks for LSTM networks" (ICLR 2017 workshop), the baseline LSTM-8192-1024
of Jozefowicz et al., "Exploring the limits of language modeling" (arXiv:1602.02410, 2016),
without CNN inputs: embedding 1024, two LSTM layers with 8192 cells projected to 1024
(``nn.LSTM(proj_size=1024)``), dropout 0.1 before and after each LSTM layer, a softmax layer
over the One Billion Word vocabulary of 793,470 words; 20 unrolled steps, batch 128 per GPU
(okuchaiev/f-lm). 1,776,946,046 parameters (the paper's "1.8B"; PyTorch's LSTM has two bias
vectors where TensorFlow's has one, 65,536 more). ``forward(tokens)`` returns full-softmax
logits ``(batch, seq_len, vocab)``: the reference trains with a sampled softmax of 8,192
classes, which this model does not reproduce, so its last layer's activations are larger.

Both models are batch-first.

>>> model = GNMT(vocab=50, hidden=16, n_layer=4)
>>> src, tgt = torch.randint(0, 50, (2, 7)), torch.randint(0, 50, (2, 5))
>>> model(src, tgt).shape
torch.Size([2, 5, 50])
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import MemflowError
from .spec import ModelSpec, token_inputs

__all__ = ["BahdanauAttention", "GNMT", "BigLSTM", "SPECS"]


def _lstm_out(x: torch.Tensor, lstm: nn.LSTM) -> torch.Tensor:
    # Training runs whole sequences from a zero state; only the outputs are used.
    return lstm(x)[0]


class BahdanauAttention(nn.Module):
    """Additive attention, normalized as in GNMT v2: ``softmax(v . tanh(Wq q + Wk k + b)) k``."""

    def __init__(self, hidden: int, init: float = 0.1):
        super().__init__()
        self.linear_q = nn.Linear(hidden, hidden, bias=False)
        self.linear_k = nn.Linear(hidden, hidden, bias=False)
        # GNMT v2's initialisation: uniform(-0.1, 0.1) vector, scalar 1/sqrt(n), zero bias.
        self.linear_att = nn.Parameter(torch.empty(hidden).uniform_(-init, init))
        self.normalize_scalar = nn.Parameter(torch.full((1,), 1.0 / math.sqrt(hidden)))
        self.normalize_bias = nn.Parameter(torch.zeros(hidden))

    def forward(self, query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        q = self.linear_q(query).unsqueeze(2)          # (b, t_q, 1, n)
        k = self.linear_k(keys).unsqueeze(1)           # (b, 1, t_k, n)
        att = self.linear_att / self.linear_att.norm() * self.normalize_scalar
        scores = torch.tanh(q + k + self.normalize_bias).matmul(att)   # (b, t_q, t_k)
        return torch.bmm(F.softmax(scores, dim=-1), keys)


class GNMTEncoder(nn.Module):
    """Bidirectional LSTM, then unidirectional ones with residual adds from the third on."""

    def __init__(self, hidden: int, n_layer: int, dropout: float):
        super().__init__()
        self.rnn_layers = nn.ModuleList(
            [nn.LSTM(hidden, hidden, batch_first=True, bidirectional=True),
             nn.LSTM(2 * hidden, hidden, batch_first=True)]
            + [nn.LSTM(hidden, hidden, batch_first=True) for _ in range(n_layer - 2)])
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, lstm in enumerate(self.rnn_layers):
            y = _lstm_out(self.dropout(x), lstm)
            x = y + x if i >= 2 else y
        return x


class GNMTDecoder(nn.Module):
    """First LSTM feeds the attention; later ones read [input, context]; residual from the third."""

    def __init__(self, hidden: int, n_layer: int, dropout: float, vocab: int):
        super().__init__()
        self.att_rnn = nn.LSTM(hidden, hidden, batch_first=True)
        self.attn = BahdanauAttention(hidden)
        self.rnn_layers = nn.ModuleList(nn.LSTM(2 * hidden, hidden, batch_first=True)
                                        for _ in range(n_layer - 1))
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(hidden, vocab)

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        x = _lstm_out(x, self.att_rnn)
        attn = self.attn(x, context)
        for i, lstm in enumerate(self.rnn_layers):
            y = _lstm_out(torch.cat((self.dropout(x), attn), dim=2), lstm)
            x = y + x if i >= 1 else y
        return self.classifier(x)


class GNMT(nn.Module):
    """GNMT: shared embedding, residual LSTM encoder and attentional decoder, classifier."""

    def __init__(self, vocab: int = 32320, hidden: int = 1024, n_layer: int = 8,
                 dropout: float = 0.2):
        super().__init__()
        if n_layer < 2:
            raise MemflowError(f"GNMT n_layer={n_layer} is too small; valid: n_layer >= 2 "
                               "(a bidirectional and a unidirectional encoder layer)")
        self.vocab = vocab
        self.embedder = nn.Embedding(vocab, hidden)
        self.encoder = GNMTEncoder(hidden, n_layer, dropout)
        self.decoder = GNMTDecoder(hidden, n_layer, dropout, vocab)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        context = self.encoder(self.embedder(src))
        return self.decoder(self.embedder(tgt), context)


class BigLSTM(nn.Module):
    """LSTM language model with projection: embedding, LSTMP layers, full softmax layer."""

    def __init__(self, vocab: int = 793470, embed: int = 1024, hidden: int = 8192,
                 proj: int = 1024, n_layer: int = 2, dropout: float = 0.1):
        super().__init__()
        self.vocab = vocab
        self.embedding = nn.Embedding(vocab, embed)
        self.dropout = nn.Dropout(dropout)
        self.lstm = nn.ModuleList(
            nn.LSTM(embed if i == 0 else proj, hidden, proj_size=proj, batch_first=True)
            for i in range(n_layer))
        self.softmax = nn.Linear(proj, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.dropout(self.embedding(tokens))
        for lstm in self.lstm:
            x = self.dropout(_lstm_out(x, lstm))
        return self.softmax(x)


def seq2seq_inputs(model: GNMT, batch_size: int, src_len: int,
                   tgt_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Source and target token ids, ``(batch, src_len)`` and ``(batch, tgt_len)`` int64.

    >>> [t.shape for t in seq2seq_inputs(GNMT(vocab=9, hidden=4, n_layer=2), 2, 6, 3)]
    [torch.Size([2, 6]), torch.Size([2, 3])]
    """
    return token_inputs(model, batch_size, src_len) + token_inputs(model, batch_size, tgt_len)


SPECS = (
    ModelSpec("gnmt", "rnn", GNMT, seq2seq_inputs,
              arch={"vocab": 32320, "hidden": 1024, "n_layer": 8, "dropout": 0.2},
              data={"src_len": 50, "tgt_len": 50}, batch_size=128,
              input="(src_tokens, tgt_tokens), each (batch, 50) int64",
              output="logits (batch, tgt_len, vocab)",
              source="Wu et al. 2016 (arXiv:1609.08144); NVIDIA DeepLearningExamples GNMT v2"),
    ModelSpec("biglstm", "rnn", BigLSTM, token_inputs,
              arch={"vocab": 793470, "embed": 1024, "hidden": 8192, "proj": 1024,
                    "n_layer": 2, "dropout": 0.1},
              data={"seq_len": 20}, batch_size=128,
              input="token ids (batch, seq_len) int64; seq_len 20",
              output="logits (batch, seq_len, vocab), full softmax",
              source="Jozefowicz et al. 2016 (arXiv:1602.02410) LSTM-8192-1024; "
                     "Kuchaiev & Ginsburg 2017 BIGLSTM (okuchaiev/f-lm)"),
)
