"""The keep/selective ILP: what it promises holds in the memory model and in the exported
model, and it recomputes less than selective everywhere."""
import pytest
import torch
from torch import nn

import memflow
from memflow.export import apply, validate
from memflow.export.validation import predicted_held
from memflow.planners import Infeasible
from memflow.planners.selective import selective_plan
from memflow.strategy import Strategy


def _mlp():
    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(a, b), nn.GELU(), nn.LayerNorm(b))
              for a, b in ((32, 64), (64, 128), (128, 32), (32, 64))]
    return nn.Sequential(*blocks), torch.randn(16, 32)


@pytest.mark.parametrize("budget", [0.7, 0.5])
def test_plan_fits_its_budget_in_the_model_and_in_pytorch(budget):
    model, x = _mlp()
    g = memflow.from_torch(model, x)
    keep = g.units["saved_bytes"].sum()
    s = selective_plan(g, budget)
    assert "selective" in s.policies
    assert Strategy.from_json(s.to_json()) == s
    assert sum(predicted_held(g, s).values()) <= budget * keep
    table = validate(model, x, s, g)
    assert table.loc["saved_bytes", "measured"] <= budget * keep * 1.01
    assert abs(table.loc["saved_bytes", "error"]) <= 0.01
    exported = apply(model, s, g)
    grads = []
    for m in (model, exported):
        m(x).pow(2).mean().backward()
        grads.append([p.grad.clone() for p in m.parameters()])
        m.zero_grad()
    assert all(torch.equal(a, b) for a, b in zip(*grads))
    # it recomputes fewer cheap FLOPs than putting every unit under selective
    u = g.units
    cheap = u["fwd_flops"] - u["expensive_fwd_flops"]
    chosen = [p == "selective" for p in s.policies]
    assert cheap[chosen].sum() < cheap.sum()


def test_a_budget_below_selective_everywhere_is_infeasible():
    model, x = _mlp()
    g = memflow.from_torch(model, x)
    with pytest.raises(Infeasible, match="selective_plan"):
        selective_plan(g, 0.05)
