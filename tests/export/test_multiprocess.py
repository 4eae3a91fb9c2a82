"""The exported script runs pipelined and tensor-parallel strategies under torchrun (gloo on
CPU), one process per stage or shard, and trains along the losses of the same script run in
one process."""
import importlib.util
import os
import subprocess
import sys

import pytest

import memflow
from memflow.export import script
from memflow.export.multiprocess import across_processes, processes
from memflow.export.scripts import run_line
from memflow.strategy import Strategy

CHAIN = {"n": 4, "width": 16}


def _torchrun(path, tmp_path, n):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
         str(n), str(path), "--steps", "3"],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    losses = [float(line.rsplit(" ", 1)[1]) for line in run.stdout.splitlines()
              if line.startswith("step ")]
    assert len(losses) == 3 and losses[-1] < losses[0], run.stdout
    return losses


def _in_process(graph, tmp_path):
    path = script(Strategy.single_device(graph), tmp_path / "one" / "train.py", model="chain",
                  model_options=CHAIN, batch_size=8, lr=0.05, graph=graph)
    spec = importlib.util.spec_from_file_location("one_train", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main(["--steps", "3"])


@pytest.mark.slow       # torchrun, 2 processes
@pytest.mark.parametrize("kind", ["pipeline", "tensor"])
def test_torchrun_trains_a_strategy_across_processes(kind, tmp_path):
    g = memflow.zoo.graph("chain", batch_size=8, units="blocks", **CHAIN)
    s = (Strategy.pipeline(g, 2, stages=2, microbatches=2, schedule="1f1b").with_policy(
        recompute=g.names[:1]) if kind == "pipeline" else Strategy.tensor_parallel(g, 2, tp=2))
    assert processes(s, across_processes(s)) == 2
    path = script(s, tmp_path / "train.py", model="chain", model_options=CHAIN, batch_size=8,
                  lr=0.05, graph=g)
    assert "--nproc_per_node 2" in run_line(s, path)
    assert _torchrun(path, tmp_path, 2) == pytest.approx(_in_process(g, tmp_path), rel=1e-5)
