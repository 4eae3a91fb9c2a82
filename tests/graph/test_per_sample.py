"""``per_sample`` in the tensors table: the storages whose size scales with the batch."""
import pytest
import torch
from torch import nn

from memflow.graph.capture import from_torch


def _per_sample(g) -> dict[tuple, set[bool]]:
    """Shape -> the per_sample flags of the storages of that shape."""
    out: dict[tuple, set[bool]] = {}
    for shape, flag in zip(g.tensors["shape"], g.tensors["per_sample"]):
        out.setdefault(tuple(shape), set()).add(bool(flag))
    return out


@pytest.mark.parametrize("channels", [3, 4, 8])         # fewer, as many, twice the samples
def test_batch_norm_statistics_are_per_channel(channels):
    b = 4
    model = nn.Sequential(nn.Conv2d(3, channels, 3), nn.BatchNorm2d(channels), nn.ReLU())
    flags = _per_sample(from_torch(model, torch.randn(b, 3, 8, 8)))
    assert flags[(channels,)] == {False}                 # save_mean, save_invstd
    assert flags[(b, channels, 6, 6)] == {True}


def test_instance_norm_statistics_are_per_sample():
    # instance norm runs batch norm on (1, N·C, H, W): one statistic per sample and channel
    b, c = 4, 3
    model = nn.Sequential(nn.Conv2d(3, c, 3), nn.InstanceNorm2d(c, affine=True))
    t = from_torch(model, torch.randn(b, 3, 8, 8)).tensors
    stats = t[(t["shape"].map(tuple) == (b * c,)) & ~t["requires_grad"]]
    assert len(stats) == 2 and stats["per_sample"].all()


class Tokens(nn.Module):
    """A tiny language model's step: flattened logits, a per-token loss, a causal mask built
    from the input with ``new_ones``, and a statistic over the batch."""

    def __init__(self, vocab=10, hidden=8):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, ids):
        b, s = ids.shape
        h = self.embed(ids)                                       # (b, s, h)
        mask = ids.new_ones(s, s, dtype=torch.float).tril()       # (s, s): not per sample
        h = h + (mask @ h) * 0.5
        h = h - h.mean(0) * torch.sigmoid(h)                      # (s, h) over the batch: not
        logits = self.head(h).view(b * s, -1)                     # (b·s, V)
        loss = nn.functional.cross_entropy(logits, ids.view(-1), reduction="none")  # (b·s,)
        return (loss * torch.sigmoid(loss)).mean()


def test_flattened_tokens_per_token_loss_and_mask():
    b, s, vocab = 2, 6, 10                   # s a multiple of b: (s, s) must still not count
    flags = _per_sample(from_torch(Tokens(vocab), torch.randint(0, vocab, (b, s))))
    assert flags[(b * s, vocab)] == {True}                # logits, log-softmax
    assert flags[(b * s,)] == {True}                      # per-token loss
    assert flags[(s, s)] == {False}                       # causal mask
    assert flags[(s, 8)] == {False}                       # mean over the batch
    assert flags[(b, s, 8)] == {True}
    assert all(f == {False} for shape, f in flags.items() if len(shape) == 0)
