"""The real-step harness of benchmarks/bench_seeds.py: offloading and recomputation under
saved-tensor hooks and torch.utils.checkpoint leave the gradients as they are."""
import copy
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from bench_seeds import RealStep  # noqa: E402


def test_real_step_keeps_gradients():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(),
                          nn.Linear(32, 4))
    x = torch.randn(8, 16)
    ref = copy.deepcopy(model)
    ref(x).square().sum().backward()
    layers = {str(i): m for i, m in enumerate(model)}
    step = RealStep(model, layers, offload=["0", "2"], recompute=["3", "4"])
    step(x).square().sum().backward()
    for (name, a), b in zip(ref.named_parameters(), model.parameters()):
        assert torch.allclose(a.grad, b.grad), name
