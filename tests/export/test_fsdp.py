"""Shard levels in the exported script (issue 14 item 2, FSDP2 and ZeRO-1): one step of a
sharded strategy over 2 gloo processes gives the loss and the full gradients of the
single-process original, and each rank holds the model-state bytes the simulator predicts."""
import importlib.util
import os
import subprocess
import sys

import pytest
import torch

import memflow
from memflow.export import apply, script
from memflow.export.accumulation import accumulate, accumulates
from memflow.export.factory import build_model
from memflow.export.fsdp import shard_model, sharded
from memflow.export.train_template import loss_of
from memflow.strategy import Strategy
from memflow.strategy.runnable import root_sharded, unrunnable

from gloo_ranks import run_ranks

BATCH, WORLD = 4, 2
MODELS = {"chain": dict(n=3, width=8),
          "gpt2": dict(vocab=40, max_positions=16, hidden=16, n_layer=1, n_head=2, seq_len=6,
                       dropout=0.0)}


def _graph(model):
    return memflow.zoo.graph(model, batch_size=BATCH, **MODELS[model])


def _local(t):
    return getattr(t, "_local_tensor", t)


def _full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _worker(rank, model, doc):
    """One replica's step: its loss, full gradients and the model-state bytes it holds."""
    import torch.distributed as dist
    s = Strategy.from_dict(doc)
    made, example = build_model(model, BATCH // WORLD, MODELS[model], device="cpu",
                                seed=rank)
    with torch.no_grad():       # the batch's target, sliced per micro-batch if accumulating
        _, target = loss_of("auto", made(*_args(example)), None, 1000 + rank)
    exported = apply(made, s, inplace=True, replica=rank)
    sharding = shard_model(exported)
    optimizer = sharding.optimizer(torch.optim.Adam, lr=1e-3)
    if accumulates(s):      # DDP's no_sync / FSDP2's deferred reduce-scatter but on the last
        m = s.microbatches
        loss = accumulate(sharding.module, (_args(example), {}), m, lambda out, k: loss_of(
            "auto", out, target.tensor_split(m)[k], 1000 + rank)[0], sharding.no_sync)
    else:
        loss, _ = loss_of("auto", sharding.module(*_args(example)), target, 1000 + rank)
        loss.backward()
    sharding.after_backward()
    grads = {n: _full(p.grad).detach().clone() for n, p in exported.module.named_parameters()}
    held = {"weights": sum(_local(t).nbytes for t in [*exported.module.parameters(),
                                                        *exported.module.buffers()]),
            "gradients": sum(_local(p.grad).nbytes for p in exported.module.parameters())}
    optimizer.step()
    states = [o.optim.state if hasattr(o, "optim") else o.state
              for o in getattr(optimizer, "parts", [optimizer])]
    held["optimizer"] = sum(_local(t).nbytes for st in states for v in st.values()
                            for k, t in v.items() if k != "step")
    value = loss.detach()
    dist.all_reduce(value)
    return float(value) / WORLD, grads, held


def _args(example):
    return tuple(example) if isinstance(example, (tuple, list)) else (example,)


def _original(model):
    """The single-process step the replicas split: rank 0's weights, each replica's batch
    and target, the mean of their losses."""
    made, _ = build_model(model, BATCH // WORLD, MODELS[model], device="cpu", seed=0)
    total = 0
    for r in range(WORLD):
        example = build_model(model, BATCH // WORLD, MODELS[model], device="cpu", seed=r)[1]
        total = total + loss_of("auto", made(*_args(example)), None, 1000 + r)[0] / WORLD
    total.backward()
    return float(total.detach()), {n: p.grad for n, p in made.named_parameters()}


def _strategies(model):
    g = _graph(model)
    dp = Strategy.data_parallel(g, WORLD)
    names = g.names
    own = [n for n, r, p in zip(names, root_sharded(g), g.units["params"]) if p and not r]
    mixed = dp.with_shard({n: "parameters" for n in own[::2]})
    return g, {"zero3": dp.with_shard("parameters"), "zero2": dp.with_shard("gradients"),
               # gradient accumulation rides along: under DDP (zero1) and FSDP2 (mixed)
               "zero1": dp.with_shard("optimizer").with_schedule(microbatches=2,
                                                                 schedule="1f1b"),
               "mixed": mixed.with_policy(recompute=names[1:3]).with_schedule(
                   microbatches=2, schedule="1f1b"),
               "offload": dp.with_shard("parameters").with_policy({names[2]: "offload"})}


CASES = [(m, k) for m in MODELS for k in ("zero3", "zero2", "zero1", "mixed")] + [
    ("chain", "offload")]


@pytest.mark.slow       # spawns 2 processes
@pytest.mark.parametrize("model, kind", CASES)
def test_sharded_step_matches_the_original(model, kind, tmp_path):
    g, strategies = _strategies(model)
    s = strategies[kind]
    assert sharded(s) and unrunnable(s, g) is None
    ranks = run_ranks(_worker, WORLD, tmp_path, model, s.to_dict())
    loss, grads = _original(model)
    for value, got, _ in ranks:
        assert value == pytest.approx(loss, rel=1e-5)
        assert got.keys() == grads.keys()
        for name, grad in grads.items():
            torch.testing.assert_close(got[name], grad, rtol=1e-5, atol=1e-6, msg=name)
    # model states per rank against the simulator's prediction
    predicted = memflow.simulate(g, s, memflow.Cluster.preset("2xV100-16GB"),
                                 optimizer="adam").model_states.iloc[0]
    held = [h for _, _, h in ranks]
    for h in held:
        assert h["gradients"] == pytest.approx(predicted["gradients"], rel=0.01)
        # FSDP2's reshard_after_forward=False keeps a 1/N shard of the parameters between
        # steps (and all of them gathered from forward to backward); ZeRO-2 as the simulator
        # charges it keeps them whole
        buffers = float(g.units["buffer_bytes"].sum())      # never sharded
        weights = (predicted["weights"] - buffers) / (WORLD if kind == "zero2" else 1) + buffers
        assert h["weights"] == pytest.approx(weights, rel=0.01)
    # ZeroRedundancyOptimizer gives each rank whole tensors' states: shared out unevenly
    total = sum(h["optimizer"] for h in held)
    assert total == pytest.approx(WORLD * predicted["optimizer"], rel=0.01 / WORLD)
    if kind != "zero1":
        assert [h["optimizer"] for h in held] == pytest.approx(
            [predicted["optimizer"]] * WORLD, rel=0.01)


def _script_losses(s, g, path, *torchrun, nproc=WORLD):
    path = script(s, path, model="chain", model_options=MODELS["chain"], batch_size=BATCH,
                  lr=0.05, optimizer="adam", graph=g)
    if not torchrun:
        spec = importlib.util.spec_from_file_location("one_train", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.main(["--steps", "3"])
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc_per_node", str(nproc), str(path), "--steps", "3"],
                         capture_output=True, text=True, timeout=300, cwd=path.parent,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    return [float(line.rsplit(" ", 1)[1]) for line in run.stdout.splitlines()
            if line.startswith("step ")]


@pytest.mark.slow       # torchrun, 2 processes
def test_the_script_trains_sharded_model_states_under_torchrun(tmp_path):
    """The exported script runs a per-unit mix of ZeRO-3, ZeRO-1 and none with FSDP2 and
    ZeroRedundancyOptimizer: 3 Adam steps along the losses of the unsharded strategy."""
    g, strategies = _strategies("chain")
    mixed = strategies["mixed"].with_shard({"layers.1.fc": "optimizer"})
    assert list(mixed.shard_levels[::2]) == ["parameters", "optimizer", "parameters"]
    plain = Strategy.data_parallel(g, WORLD)
    losses = _script_losses(mixed, g, tmp_path / "sharded" / "train.py", "torchrun")
    assert len(losses) == 3 and losses[-1] < losses[0]
    assert losses == pytest.approx(_script_losses(plain, g, tmp_path / "plain" / "train.py",
                                                  "torchrun"), rel=1e-5)


@pytest.mark.slow       # torchrun, 4 processes
def test_fsdp2_composes_with_tensor_parallelism(tmp_path):
    """2 replicas x 2 tensor-parallel shards: FSDP2 shards the DTensor shards over the
    replicas (ZeRO-3 and ZeRO-1 on split units, ZeRO-2 elsewhere) along the unsharded losses."""
    g = memflow.zoo.graph("chain", batch_size=BATCH, **MODELS["chain"])
    tp = Strategy.tensor_parallel(g, 4, tp=2, dp=2)
    assert int(tp.sample[0]) == 2 and int(tp.parameter.max()) == 2
    split = [n for n, p in zip(g.names, tp.parameter) if p > 1]
    s = tp.with_shard("gradients").with_shard(dict.fromkeys(split, "parameters")).with_shard(
        {split[0]: "optimizer"})        # ZeroRedundancyOptimizer over a DTensor's shard
    assert unrunnable(s, g) is None
    losses = _script_losses(s, g, tmp_path / "sharded" / "train.py", "torchrun", nproc=4)
    assert len(losses) == 3 and losses[-1] < losses[0]
    assert losses == pytest.approx(_script_losses(tp, g, tmp_path / "plain" / "train.py",
                                                  "torchrun", nproc=4), rel=1e-5)
