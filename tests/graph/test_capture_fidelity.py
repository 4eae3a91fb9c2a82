"""Capture's saved bytes equal what real CPU autograd saves (within 0.5%; in practice exactly)."""
import os

import pandas as pd
import pytest
import torch

from memflow.graph.capture import from_torch
from memflow.graph.measure import saved_bytes, saved_bytes_by_module

from capture_models import CASES

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def close(captured: float, real: float) -> bool:
    return abs(captured - real) <= 0.005 * real


@pytest.mark.parametrize("name", sorted(CASES))
def test_total_saved_bytes_match_real_cpu_autograd(name):
    torch.manual_seed(0)
    model, inputs = CASES[name]()
    graph = from_torch(model, inputs)
    real = saved_bytes(model, inputs)
    assert real > 0
    assert close(graph.units["saved_bytes"].sum(), real), (graph.units["saved_bytes"].sum(), real)


@pytest.mark.parametrize("name", ["residual", "lstm", "attention", "tied-inplace", "hf-gpt2"])
def test_saved_bytes_per_module_match_real(name):
    # At leaf granularity a unit is the innermost module, as the real measure attributes.
    torch.manual_seed(0)
    model, inputs = CASES[name]()
    graph = from_torch(model, inputs)
    captured = graph.units.groupby("module")["saved_bytes"].sum()
    real = saved_bytes_by_module(model, inputs)
    both = pd.concat([captured[captured > 0].rename("capture"), real.rename("real")],
                     axis=1).fillna(0)
    assert (both["capture"] == both["real"]).all(), both[both["capture"] != both["real"]]


@pytest.mark.parametrize("autocast", ["bfloat16", "float16"])
@pytest.mark.parametrize("name", ["residual", "attention", "hf-gpt2"])
def test_autocast_matches_real_cpu_autocast(name, autocast):
    torch.manual_seed(0)
    model, inputs = CASES[name]()
    graph = from_torch(model, inputs, autocast=autocast)
    assert graph.meta["autocast"] == autocast
    assert close(graph.units["saved_bytes"].sum(), saved_bytes(model, inputs, autocast=autocast))


def test_half_model_matches_real():
    torch.manual_seed(0)
    model, x = CASES["residual"]()
    model, x = model.to(torch.bfloat16), x.to(torch.bfloat16)
    assert close(from_torch(model, x).units["saved_bytes"].sum(), saved_bytes(model, x))


def test_loss_fn_is_a_unit_and_matches_real():
    torch.manual_seed(0)
    model, ids = CASES["hf-gpt2"]()

    def loss_fn(out):
        logits = out.logits
        return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1),
                                                 ids[:, 1:].flatten())

    graph = from_torch(model, ids, loss_fn=loss_fn)
    assert graph.names[-1] == "<loss>"
    loss = graph.units.loc["<loss>"]
    assert loss["saved_bytes"] > 0 and loss["fwd_flops"] > 0 and loss["bwd_flops"] > 0
    assert close(graph.units["saved_bytes"].sum(), saved_bytes(model, ids, loss_fn=loss_fn))


def test_eval_mode_saves_what_eval_saves():
    torch.manual_seed(0)
    model, x = CASES["attention"]()
    model.eval()
    train = from_torch(CASES["attention"]()[0], x).units["saved_bytes"].sum()
    evaluated = from_torch(model, x).units["saved_bytes"].sum()
    assert evaluated == saved_bytes(model, x) < train        # no dropout masks in eval
