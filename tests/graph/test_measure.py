"""The real-tensor yardstick: each saved storage once, parameters excluded."""
import pytest
import torch
from torch import nn

from memflow.errors import CaptureError
from memflow.graph.measure import saved_bytes, saved_bytes_by_module


class Views(nn.Module):
    """Saves two views of one storage (mul saves both operands) and a view of a weight."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 8))

    def forward(self, x):
        return (x[:, :4] * x[:, 4:]).sum() + (x[:, :4] * self.w.t()[0]).sum()


def test_views_count_once_and_parameters_never():
    x = torch.randn(3, 8, requires_grad=True)
    assert saved_bytes(Views(), x) == x.numel() * 4


def test_by_module_names_innermost_modules_root_and_loss():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    x = torch.randn(2, 4)
    by = saved_bytes_by_module(model, x, loss_fn=lambda out: out.exp().sum())
    assert by.to_dict() == {"0": 32, "1": 32, "<loss>": 32}
    assert saved_bytes(model, x, lambda out: out.exp().sum()) == 96


def test_autocast_runs_under_cpu_autocast():
    model, x = nn.Sequential(nn.Linear(4, 4)), torch.randn(2, 4, requires_grad=True)
    # The bfloat16 copies of x and of the weight (a cast is not a view of the parameter).
    assert saved_bytes(model, x, autocast="bfloat16") == 2 * 4 * 2 + 4 * 4 * 2


def test_meta_models_cannot_be_measured():
    with torch.device("meta"):
        model = nn.Linear(4, 4)
    with pytest.raises(CaptureError, match="meta device"):
        saved_bytes(model, torch.randn(2, 4))
