"""Units are followed at run time exactly as capture cut them: shared modules called twice,
modules that run no op, glue split by child calls, nested glue."""
import pytest
import torch
from torch import nn

import memflow
from memflow.export import apply, validate
from memflow.strategy import Strategy

from models import grads, mismatches


class Shared(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.skip, self.out = nn.Linear(6, 6), nn.Identity(), nn.Linear(6, 2)

    def forward(self, x):
        y = torch.tanh(self.fc(x))             # glue, fc, glue
        y = self.skip(y) * 2                   # Identity runs no op: the glue goes on
        return self.out(torch.sin(self.fc(y)))  # fc again (fc#2), glue, out


class Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x):
        return torch.sigmoid(self.fc(x) + x) * x


class Nested(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = Inner(), Inner()

    def forward(self, x):
        return torch.cos(self.b(torch.exp(-self.a(x))))


@pytest.mark.parametrize("model, names", [
    (Shared(), ["fc", "<root>", "fc#2", "<root>#2", "out"]),
    (Nested(), ["a.fc", "a", "<root>", "b.fc", "b", "<root>#2"]),
])
def test_every_single_unit_recomputed_or_offloaded(model, names):
    x = torch.randn(4, 6)
    graph = memflow.from_torch(model, x)
    assert graph.names == names
    reference = grads(model, x)
    for unit in names:
        for policy in ("recompute", "offload"):
            s = Strategy.single_device(graph).with_policy({unit: policy})
            assert mismatches(reference, grads(apply(model, s, graph), x)) == [], (unit, policy)
            table = validate(model, x, s, graph)
            assert table.loc["saved_bytes", "error"] == 0, (unit, policy)
            assert table.loc["offloaded_bytes", "error"] == 0, (unit, policy)


def test_segments_across_module_boundaries():
    # A segment may start in one module's glue and end inside another module.
    model, x = Nested(), torch.randn(4, 6)
    graph = memflow.from_torch(model, x)
    s = Strategy.single_device(graph).with_policy(recompute=["a", "<root>", "b.fc"])
    assert s.segment.tolist() == [-1, 0, 0, 0, -1, -1]
    assert mismatches(grads(model, x), grads(apply(model, s, graph), x)) == []
    assert validate(model, x, s, graph).loc["saved_bytes", "error"] == 0
