"""The ``amp`` precision in the exported script (:mod:`memflow.export.amp`): float16 autocast
over fp32 model states with a loss scaler, on whole-model replicas — one process, and gloo
ranks under DistributedDataParallel, FSDP2 and ZeRO-1 — holding what the memory model
predicts from capture's amp pass (measured per rank, never against memflow)."""
import pytest
import torch

import memflow
from memflow.export.rank_validation import METRICS, validate_ranks
from memflow.strategy import Strategy
from memflow.strategy.runnable import unrunnable

from test_fsdp import BATCH, MODELS, WORLD, _graph
from test_model_states import one_replica_losses


def _exact(df, zero1: bool = False, host: bool = False):
    # on a CPU host and device are one memory: the states FSDP2's CPUOffloadPolicy keeps on
    # the host are measured as the rank's optimizer bytes (docs/export.md), so with the
    # optimizer on the host the step is checked to run and the other metrics compared
    for metric in METRICS[:-1] if host else METRICS:
        if zero1 and metric == "optimizer":
            # ZeroRedundancyOptimizer gives each rank whole tensors' states: shared out
            # unevenly (as in test_fsdp), their sum is the prediction's
            assert df[f"{metric}_measured"].sum() == pytest.approx(
                df[f"{metric}_predicted"].sum(), rel=0.01)
            continue
        bad = df[df[f"{metric}_error"].abs() > 0.01]
        assert bad.empty, f"{metric}: {bad.T}"


@pytest.mark.parametrize("model,more", [("gpt2", "plain"), ("chain", "accumulation, host"),
                                        ("chain", "gpipe")])
def test_one_replica_script_trains_under_autocast(tmp_path, model, more):
    """Without torchrun: fp32 weights, float16 autocast forward, a scaled backward — also
    under gradient accumulation with a unit's optimizer on the host, and with GPipe's
    micro-batches in one stage (what the search found for gnmt on 8 V100s); the loss falls."""
    g = _graph(model)
    s = Strategy.single_device(g).with_model_states(precision="amp")
    if more == "gpipe":
        s = s.with_schedule(microbatches=2, schedule="gpipe")
    elif more != "plain":
        s = s.with_schedule(microbatches=2, schedule="1f1b").with_model_states(
            offload_optimizer=g.names[:1])
    assert unrunnable(s, g) is None
    losses = one_replica_losses(s, g, tmp_path / "train.py", model)
    assert len(losses) == 4 and losses[-1] < losses[0]


@pytest.mark.slow       # one torchrun launch of 2 processes each
@pytest.mark.parametrize("model,shard,host", [("gpt2", "none", False),
                                              ("chain", "parameters", False),
                                              ("chain", "optimizer", False),
                                              ("chain", "parameters", True)])
def test_the_amp_script_holds_what_is_predicted_on_its_ranks(tmp_path, model, shard, host):
    """DistributedDataParallel, FSDP2 (zero-3, also with CPUOffloadPolicy) and ZeRO-1 under
    autocast: held activations (autocast's half weight copies among them), fp32 weights,
    gradients and Adam states."""
    g = _graph(model)
    s = Strategy.data_parallel(g, WORLD).with_model_states(precision="amp",
                                                           offload_optimizer=host)
    if shard != "none":
        s = s.with_shard(shard)
    df = validate_ranks(s, model, model_options=MODELS[model], batch_size=BATCH, graph=g,
                        folder=tmp_path)
    _exact(df, zero1=shard == "optimizer", host=host)


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
