"""The exported training script: written beside its strategy, run by torchrun on CPU (gloo)
with DistributedDataParallel over the replicas, and it trains."""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import memflow
from memflow.errors import ExportError, MemflowError
from memflow.export import script
from memflow.strategy import Strategy

CHAIN = {"n": 3, "width": 16}


def _graph():
    return memflow.zoo.graph("chain", batch_size=8, units="blocks", **CHAIN)


def _load(path: Path):
    spec = importlib.util.spec_from_file_location("exported_train", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_torchrun_two_replicas_recompute_two_steps(tmp_path):
    g = _graph()
    s = Strategy.data_parallel(g, 2).with_policy(recompute=g.names[:2], offload=g.names[2:])
    path = script(s, tmp_path / "train.py", model="chain", model_options=CHAIN, batch_size=8)
    assert (tmp_path / "train.json").is_file()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
         "2", str(path), "--steps", "2"],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    log = run.stdout + run.stderr
    assert "step 1/2 loss" in log and "step 2/2 loss" in log


def test_the_loss_falls(tmp_path):
    g = _graph()
    s = Strategy.single_device(g).with_policy(recompute=g.names[1:], offload=g.names[:1])
    path = script(s, tmp_path / "train.py", model="chain", model_options=CHAIN, batch_size=8,
                  optimizer="adam", lr=0.05)
    losses = _load(path).main(["--steps", "8"])
    assert len(losses) == 8 and losses[-1] < 0.7 * losses[0]
    assert sum(b < a for a, b in zip(losses, losses[1:])) >= 6


def test_a_model_from_a_users_file(tmp_path):
    (tmp_path / "mine.py").write_text(
        "import torch\n"
        "def build(batch_size, hidden=8):\n"
        "    model = torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.ReLU(),\n"
        "                                torch.nn.Linear(hidden, 3))\n"
        "    return model, (torch.randn(batch_size, 4),)\n")
    s = Strategy(["0", "1", "2"], devices=[("gpu0",)] * 3).with_policy(recompute=["0", "1"])
    path = script(s, tmp_path / "job" / "train.py", model=f"{tmp_path / 'mine.py'}:build",
                  model_options={"hidden": 6}, batch_size=4, loss="mse", lr=0.05)
    losses = _load(path).main(["--steps", "3"])
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))


def test_bad_requests(tmp_path):
    s = Strategy.data_parallel(_graph(), 2)
    with pytest.raises(ExportError, match="sample degree 2 does not divide the batch of 3"):
        script(s, tmp_path / "t.py", model="chain", model_options=CHAIN, batch_size=3)
    with pytest.raises(ExportError, match="must be a .py file"):
        script(s, tmp_path / "t.sh", model="chain")
    with pytest.raises(MemflowError, match="has no option 'depth'"):
        script(s, tmp_path / "t.py", model="chain", model_options={"depth": 2})
    with pytest.raises(ExportError, match="no file"):
        script(s, tmp_path / "t.py", model="missing.py:build")


@pytest.mark.parametrize("make, options, message", [
    # another model's strategy: its units are no modules of this model
    (lambda: Strategy.data_parallel(memflow.zoo.graph("mlp", batch_size=8, units="blocks"), 2),
     CHAIN, "does not fit model 'chain'.*is not a module of"),
    # the same model at another size: five layers where the strategy has three
    (lambda: Strategy.data_parallel(_graph(), 2), {"n": 5, "width": 16},
     "the strategy has 3 units, the model more from 'layers.3.fc' on"),
    # a split the units' shapes do not allow
    (lambda: Strategy(_graph().names, devices=[tuple(f"gpu{i}" for i in range(64))] * 3,
                      parameter=[64] * 3),
     CHAIN, "does not fit model 'chain' at batch 8: unit 'layers.0': parameter degree 64 is"),
])
def test_a_strategy_that_does_not_fit_the_model_is_refused_before_writing(make, options,
                                                                          message, tmp_path):
    with pytest.raises(ExportError, match=message):
        script(make(), tmp_path / "job" / "train.py", model="chain", model_options=options,
               batch_size=8)
    assert not (tmp_path / "job").exists()


def test_a_graph_at_another_batch_is_refused(tmp_path):
    s = Strategy.data_parallel(_graph(), 2)
    with pytest.raises(ExportError, match="captured at batch 8, not 16"):
        script(s, tmp_path / "train.py", model="chain", model_options=CHAIN, batch_size=16,
               graph=_graph())
    assert list(tmp_path.iterdir()) == []


def test_a_factory_the_script_cannot_give_a_batch_is_refused(tmp_path):
    (tmp_path / "fixed.py").write_text(
        "import torch\n"
        "def build():\n"
        "    return torch.nn.Linear(4, 3), torch.randn(4, 4)\n")
    s = Strategy(["<root>"], devices=[("gpu0",)])
    with pytest.raises(ExportError, match="add a batch_size keyword"):
        script(s, tmp_path / "job" / "train.py", model=f"{tmp_path / 'fixed.py'}:build")
    assert not (tmp_path / "job").exists()


def test_the_batch_defaults_to_the_models_own(tmp_path):
    s = Strategy.data_parallel(_graph(), 2)
    path = script(s, tmp_path / "train.py", model="chain", model_options=CHAIN, graph=_graph())
    assert "BATCH_SIZE = 8\n" in path.read_text()


def test_a_batch_the_strategy_cannot_split_is_one_line(tmp_path, capsys, monkeypatch):
    """--batch-size shrinks a plan for a try-out; one that replicas x micro-batches do not
    divide stops the script with one line saying the valid sizes."""
    for var in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    s = Strategy.single_device(_graph()).with_schedule(microbatches=2, schedule="gpipe")
    train = _load(script(s, tmp_path / "train.py", model="chain", model_options=CHAIN,
                         batch_size=8))
    with pytest.raises(SystemExit) as stop:
        train.main(["--steps", "1", "--batch-size", "5"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["train.py: error: the global batch of 5 does not split over the strategy's "
                   "1 replicas x 2 micro-batches; use a multiple of 2 (--batch-size 4)"]
    assert len(train.main(["--steps", "1", "--batch-size", "4"])) == 1


def test_the_wrong_process_count_is_one_line_from_rank_0(tmp_path):
    s = Strategy.data_parallel(_graph(), 2)
    path = script(s, tmp_path / "train.py", model="chain", model_options=CHAIN, batch_size=8)
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
         "3", str(path), "--steps", "1"],
        capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"),
        cwd=tmp_path)
    log = run.stdout + run.stderr
    assert run.returncode != 0
    line = ("train.py: error: the strategy has 2 data-parallel replicas but 3 processes "
            "started; run it with torchrun --nproc_per_node 2")
    assert log.count(line) == 1, log[-3000:]
    assert f'File "{path}"' not in log        # no traceback from any rank of the script
