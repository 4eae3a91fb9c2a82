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
    with pytest.raises(ExportError, match="does not split over the strategy's 2"):
        script(s, tmp_path / "t.py", model="chain", model_options=CHAIN, batch_size=3)
    with pytest.raises(ExportError, match="must be a .py file"):
        script(s, tmp_path / "t.sh", model="chain")
    with pytest.raises(MemflowError, match="has no option 'depth'"):
        script(s, tmp_path / "t.py", model="chain", model_options={"depth": 2})
    with pytest.raises(ExportError, match="no file"):
        script(s, tmp_path / "t.py", model="missing.py:build")
