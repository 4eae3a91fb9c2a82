"""The ``amp`` precision in the exported script (:mod:`memflow.export.amp`): float16 autocast
over fp32 model states with a loss scaler, on whole-model replicas — one process, and gloo
ranks under DistributedDataParallel, FSDP2 and ZeRO-1 — holding what the memory model
predicts from capture's amp pass (measured per rank, never against memflow)."""
import importlib.util

import pytest
import torch

import memflow
from memflow.export import script
from memflow.export.rank_validation import METRICS, validate_ranks
from memflow.strategy import Strategy
from memflow.strategy.runnable import unrunnable

from test_fsdp import BATCH, MODELS, WORLD, _graph


def _exact(df, zero1: bool = False):
    for metric in METRICS:
        if zero1 and metric == "optimizer":
            # ZeroRedundancyOptimizer gives each rank whole tensors' states: shared out
            # unevenly (as in test_fsdp), their sum is the prediction's
            assert df[f"{metric}_measured"].sum() == pytest.approx(
                df[f"{metric}_predicted"].sum(), rel=0.01)
            continue
        bad = df[df[f"{metric}_error"].abs() > 0.01]
        assert bad.empty, f"{metric}: {bad.T}"


def test_one_replica_script_trains_under_autocast(tmp_path):
    """Without torchrun: fp32 weights, float16 autocast forward, a scaled backward; the
    loss falls."""
    g = _graph("gpt2")
    s = Strategy.single_device(g).with_model_states(precision="amp")
    path = script(s, tmp_path / "train.py", model="gpt2", model_options=MODELS["gpt2"],
                  batch_size=BATCH, lr=0.05, optimizer="adam", graph=g)
    spec = importlib.util.spec_from_file_location("amp_train", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    losses = module.main(["--steps", "4"])
    assert len(losses) == 4 and losses[-1] < losses[0]


@pytest.mark.slow       # one torchrun launch of 2 processes each
@pytest.mark.parametrize("model,shard", [("gpt2", "none"), ("chain", "parameters"),
                                         ("chain", "optimizer")])
def test_the_amp_script_holds_what_is_predicted_on_its_ranks(tmp_path, model, shard):
    """DistributedDataParallel, FSDP2 (zero-3) and ZeRO-1 under autocast: held activations
    (autocast's half weight copies among them), fp32 weights, gradients and Adam states."""
    g = _graph(model)
    s = Strategy.data_parallel(g, WORLD).with_model_states(precision="amp")
    if shard != "none":
        s = s.with_shard(shard)
    df = validate_ranks(s, model, model_options=MODELS[model], batch_size=BATCH, graph=g,
                        folder=tmp_path)
    _exact(df, zero1=shard == "optimizer")


def test_amp_runs_on_whole_model_replicas_only():
    g = _graph("chain")
    dp = Strategy.data_parallel(g, WORLD).with_model_states(precision="amp")
    assert unrunnable(dp, g) is None
    for other, word in ((Strategy.tensor_parallel(g, 2, tp=2), "parameter splits"),
                        (Strategy.pipeline(g, 2, stages=2, microbatches=2, schedule="1f1b"),
                         "pipeline stages")):
        reason = unrunnable(other.with_model_states(precision="amp"), g)
        assert reason.startswith("precision 'amp'") and word in reason
    bare = memflow.from_torch(torch.nn.Linear(4, 4), torch.randn(2, 4), amp=False)
    assert "amp pass" in unrunnable(Strategy.single_device(bare).with_model_states(
        precision="amp"), bare)
