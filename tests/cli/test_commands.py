"""Each subcommand at small size: files written, valid JSON, readable output."""
import json
import shlex

import pandas as pd
import pytest

import memflow
from memflow.cli import main

from .conftest import CLUSTER, SMALL


def test_search_writes_the_plan_folder(plan, capsys):
    names = sorted(p.name for p in plan.iterdir())
    assert names == ["history.csv", "search.json", "strategy.json", "summary.json"]
    strategy = memflow.Strategy.from_json(plan / "strategy.json")
    assert len(strategy) == 4
    summary = json.loads((plan / "summary.json").read_text())
    assert summary["model"] == "chain" and summary["options"] == {"n": 4, "width": 32}
    assert summary["iterations"] == 20 and summary["feasible"] is True
    assert set(summary["peak"]) == {"gpu0", "gpu1"}
    history = pd.read_csv(plan / "history.csv")
    assert len(history) == 20 and {"cost", "best_cost", "accepted"} <= set(history.columns)
    search = memflow.MCMCSearch.load(plan / "search.json")    # graph and cluster embedded
    assert search.iteration == 20
    assert search.best.with_schedule(name=strategy.name) == strategy
    assert strategy.name == f"memflow search: best of 20 proposals from {search.best.name}"


def test_search_by_seconds_and_memory_limit(tmp_path, capsys):
    out = tmp_path / "p"
    assert main(["search", *SMALL, *CLUSTER, "--memory-limit", "40KB", "--seconds", "1",
                 "--quiet", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["capacity"] == {"gpu0": 40e3, "gpu1": 40e3}
    assert "best after" in capsys.readouterr().out


def test_a_memory_limit_may_be_a_share_of_every_gpu():
    from memflow.cli.inputs import load_cluster
    assert load_cluster("2xV100-16GB", "50%").devices["memory_bytes"].tolist() == [8 * 2**30] * 2


def test_simulate_prints_the_summary(replicated, capsys):
    assert main(["simulate", *SMALL, *CLUSTER, "--strategy", str(replicated)]) == 0
    out = capsys.readouterr().out
    assert "ms/step" in out and "headroom" in out and "gpu1" in out and "KiB" in out


def test_export_writes_a_training_script(plan, tmp_path, capsys):
    out = tmp_path / "train.py"
    assert main(["export", *SMALL, "--strategy", str(plan / "strategy.json"),
                 "--out", str(out)]) == 0
    text = out.read_text()
    assert "MODEL = 'chain'" in text and "'width': 32" in text
    assert memflow.Strategy.from_json(out.with_suffix(".json")) == \
        memflow.Strategy.from_json(plan / "strategy.json")
    compile(text, str(out), "exec")
    n = memflow.export.replicas(memflow.Strategy.from_json(plan / "strategy.json"))
    assert capsys.readouterr().out.splitlines()[-1] == \
        f"  torchrun --standalone --nproc_per_node {n} {out} --steps 10"


def test_model_from_a_file(tmp_path, capsys):
    file = tmp_path / "mine.py"
    file.write_text("import torch\n"
                    "def pair(batch_size=2):\n"
                    "    m = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.ReLU())\n"
                    "    return m, torch.randn(batch_size, 6)\n"
                    "def bare():\n"
                    "    return torch.nn.Linear(5, 3)\n")
    out = tmp_path / "p"
    assert main(["search", "--model", f"{file}:pair", "--batch", "4", *CLUSTER,
                 "--iterations", "5", "--quiet", "--out", str(out)]) == 0
    assert json.loads((out / "summary.json").read_text())["model"].endswith("mine.py:pair")
    assert main(["simulate", "--model", f"{file}:bare", "--input-shape", "5", "--batch", "4",
                 *CLUSTER, "--strategy", str(out / "strategy.json")]) == 2   # other units
    assert "memflow: error:" in capsys.readouterr().err


def test_listings(capsys):
    assert main(["zoo"]) == 0
    out = capsys.readouterr().out
    assert "resnet50" in out and "gpt2-xl" in out and "params" in out
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    assert "4xV100-16GB" in out and "16.0 GiB" in out


@pytest.mark.parametrize("argv, message", [
    (["search", "--model", "nonesuch", "--batch", "8", *CLUSTER], "unknown zoo model 'nonesuch'"),
    (["search", *SMALL, "--cluster", "3xFOO"], "unknown cluster preset '3xFOO'"),
    (["search", *SMALL, *CLUSTER, "--memory-limit", "lots"], "cannot read a size from 'lots'"),
    (["search", *SMALL, *CLUSTER, "--units", "some"], "--units 'some'"),
    (["search", *SMALL, *CLUSTER, "--iterations", "0"], "--iterations 0 must be at least 1"),
    (["search", "--batch", "8"], "required: --model, --cluster"),
    (["search", *SMALL, *CLUSTER, "--option", "n"], "--option 'n' must look like KEY=VALUE"),
    (["search", "--model", "resnet50", "--option", "depth=3", "--batch", "8", *CLUSTER],
     "depth"),
    (["simulate", *SMALL, *CLUSTER, "--strategy", "missing.json"], "missing.json: no such file"),
    (["export", *SMALL, "--strategy", "missing.json"], "missing.json: no such file"),
    (["report", "no/such/plan"], "no/such/plan"),
    (["search", "--model", "nofile.py:make", "--batch", "8", *CLUSTER], "no file 'nofile.py'"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("memflow: error: ") and message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_bad_factories(tmp_path, capsys):
    file = tmp_path / "bad.py"
    file.write_text("def broken(batch_size):\n    raise RuntimeError('no weights here')\n"
                    "def odd():\n    return 42\n"
                    "def bare():\n    import torch\n    return torch.nn.Linear(2, 2)\n")
    cases = {"broken": "the factory raised RuntimeError: no weights here",
             "odd": "must return (model, example_inputs) or an nn.Module, got int",
             "bare": "give --input-shape", "nothing": "has no function 'nothing'"}
    for name, message in cases.items():
        assert main(["search", "--model", f"{file}:{name}", "--batch", "2", *CLUSTER]) == 2
        assert message in capsys.readouterr().err
    (tmp_path / "syntax.py").write_text("def f(:\n")
    assert main(["search", "--model", f"{tmp_path / 'syntax.py'}:f", "--batch", "2",
                 *CLUSTER]) == 2
    assert "importing" in capsys.readouterr().err


def test_search_shows_a_progress_bar(tmp_path, capsys):
    assert main(["search", *SMALL, *CLUSTER, "--iterations", "8", "--out", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "search" in err and "8/8" in err
    assert "best=" in err and "feasible=yes" in err and "accept=" in err


def test_a_factory_that_would_ignore_batch_is_an_error(tmp_path, capsys):
    file = tmp_path / "fixed.py"
    file.write_text("import torch\n"
                    "def make(width=6):\n"
                    "    return torch.nn.Linear(width, 3), torch.randn(5, width)\n")
    assert main(["search", "--model", f"{file}:make", "--batch", "4", *CLUSTER]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "make() takes no batch_size keyword, so batch 4" in err
    out = tmp_path / "p"                      # without --batch: the batch of its inputs
    assert main(["search", "--model", f"{file}:make", *CLUSTER, "--iterations", "3",
                 "--quiet", "--out", str(out)]) == 0
    assert json.loads((out / "summary.json").read_text())["batch"] == 5


def test_a_zoo_model_without_batch_takes_the_zoos(tmp_path, capsys):
    out = tmp_path / "p"
    assert main(["search", "--model", "chain", "--option", "n=2", *CLUSTER, "--iterations", "3",
                 "--quiet", "--out", str(out)]) == 0
    assert json.loads((out / "summary.json").read_text())["batch"] == \
        memflow.zoo.spec_of("chain").batch_size


@pytest.mark.parametrize("command", ["search", "simulate", "export", "report", "zoo",
                                     "presets", "demo"])
def test_every_help_shows_an_example_that_parses(command, capsys):
    from memflow.cli import _EXAMPLES, parser
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = capsys.readouterr().out
    assert "examples:" in text and f"memflow {command}" in text
    assert ("returns (model, example_inputs)" in text) == (command in ("search", "simulate",
                                                                        "export"))
    for line in _EXAMPLES[command]:
        args = parser().parse_args(shlex.split(line, comments=True)[1:])
        if getattr(args, "cluster", None):
            memflow.Cluster.preset(args.cluster)


def test_export_refuses_another_models_strategy_and_writes_nothing(plan, replicated, tmp_path,
                                                                  capsys):
    out = tmp_path / "job" / "train.py"
    assert main(["export", "--model", "mlp", "--strategy", str(plan / "strategy.json"),
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("memflow: error: strategy ") and "does not fit model 'mlp'" in err
    assert "'layers.3' is not a module of MLP" in err and err.count("\n") == 1
    assert not out.parent.exists()
    assert main(["export", *SMALL[:-2], "--batch", "7", "--strategy",
                 str(replicated), "--out", str(out)]) == 2
    assert "batch 7" in capsys.readouterr().err and not out.parent.exists()
