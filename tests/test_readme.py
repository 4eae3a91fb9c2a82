"""Every command and code block of README.md runs as written, in a fresh folder.

What runs, and the only changes made to it (budgets that a flag or argument sets):

* the ```bash lines that start with ``memflow`` run in this process through
  :func:`memflow.cli.main`, which is the ``memflow`` console script (pyproject.toml), so the
  capture's one-off start-up is paid once; a search's ``--seconds N`` becomes
  ``--iterations 8``, and a search given no budget (60 s by default) gets ``--iterations 8``;
* ``./scripts/demo`` and ``./scripts/test`` set up ``.venv`` with pip and run every test (this
  one included), so they are not run here: the test checks that ``scripts/demo`` runs
  ``memflow demo`` with its arguments, and runs ``memflow demo`` on a model that takes seconds
  (the zoo's ``chain``, on the README's 4 GPUs, 20 proposals);
* the ``torchrun`` line of the plan-folder table runs as written on that demo's plan (4
  processes, gloo, 10 steps), and must be the line the demo prints;
* the ``torchrun`` line after the ``memflow`` lines must be one that ``memflow export``
  printed, and runs on the plan they made with ``--steps 1``;
* the ```python blocks run with ``exec``, ``search.run(seconds=30)`` as
  ``search.run(iterations=8)``;
* ``path/to/model.py:make`` is a small model file written for the test.
"""
import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from memflow.cli import main

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"^```(\w*)\n(.*?)^```", README, re.S | re.M)
BUDGET = ["--iterations", "8"]
TORCHRUN = "torchrun --standalone --nproc_per_node 4 plan/train.py --steps 10 --batch-size 8"
MODEL_FILE = '''import torch


def make(batch_size=16, width=32):
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(),
                                torch.nn.Linear(width, 10))
    return model, torch.randn(batch_size, width)
'''


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A fresh folder with the model file the README names; the tests run inside it."""
    here = tmp_path_factory.mktemp("readme")
    (here / "path" / "to").mkdir(parents=True)
    (here / "path" / "to" / "model.py").write_text(MODEL_FILE)
    return here


@contextlib.contextmanager
def inside(folder: Path):
    before = Path.cwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


def _memflow(line: str) -> tuple[int, str]:
    """Run one ``memflow ...`` line as the console script would; (status, stdout)."""
    argv = shlex.split(line, comments=True)[1:]
    if argv[0] in ("search", "demo"):
        if "--seconds" in argv:
            at = argv.index("--seconds")
            argv[at:at + 2] = BUDGET
        elif "--iterations" not in argv:
            argv += BUDGET
        argv.append("--quiet")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = main(argv)
    return status, out.getvalue()


def _torchrun(line: str, folder: Path) -> str:
    """Run a ``torchrun ...`` line in ``folder`` (torchrun is torch.distributed.run); its log,
    after checking that it succeeded."""
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", *shlex.split(line)[1:]],
                         cwd=folder, env=env, capture_output=True, text=True, timeout=300)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-3000:]
    return log


def _bash_lines(block: str) -> list[str]:
    return [line for line in block.splitlines() if line.strip()]


def test_the_readme_has_only_blocks_this_test_runs():
    assert BLOCKS and {lang for lang, _ in BLOCKS} == {"bash", "python"}
    scripts, *commands = [b for lang, b in BLOCKS if lang == "bash"]
    assert [shlex.split(line, comments=True) for line in _bash_lines(scripts)] == \
        [["./scripts/demo"], ["./scripts/test"]]
    assert all(line.startswith(("memflow ", "torchrun ")) for b in commands
               for line in _bash_lines(b))
    assert [line for b in commands for line in _bash_lines(b)
            if not line.startswith("memflow ")] == [TORCHRUN]
    # `memflow` is memflow.cli:main, which the lines below call; scripts/demo runs it too
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["scripts"]["memflow"] == "memflow.cli:main"
    assert (ROOT / "scripts" / "demo").read_text().rstrip().endswith(
        'exec python -m memflow.cli demo "$@"')


def test_the_demo_prints_the_readmes_torchrun_line_and_it_trains(folder):
    readme_line = re.search(r"`(torchrun [^`]*)`", README).group(1)
    with inside(folder):
        status, out = _memflow("memflow demo --model chain --option n=4 --option width=32 "
                               "--batch 64 --iterations 20")
    assert status == 0, out
    printed = [line.strip() for line in out.splitlines() if line.strip().startswith("torchrun")]
    assert printed == [readme_line]
    assert "step 10/10 loss" in _torchrun(readme_line, folder)


def test_every_memflow_line_runs(folder):
    lines = [line for lang, b in BLOCKS if lang == "bash" for line in _bash_lines(b)
             if line.startswith("memflow ")]
    assert len(lines) == 7
    printed = []
    with inside(folder):
        for line in lines:
            status, out = _memflow(line)
            assert status == 0, (line, out)
            if " export " in f" {line} ":
                assert "torchrun --standalone --nproc_per_node 4 plan/train.py" in out
                printed = [p.strip() for p in out.splitlines() if p.strip().startswith("torchrun")]
    assert (folder / "plan" / "report.html").is_file()
    assert (folder / "myplan" / "strategy.json").is_file()
    # the search -> export -> torchrun sequence: the README's line is one export printed
    assert TORCHRUN in printed
    assert "step 1/1 loss" in _torchrun(TORCHRUN.replace("--steps 10", "--steps 1"), folder)


def test_every_python_block_runs(folder):
    blocks = [b for lang, b in BLOCKS if lang == "python"]
    assert len(blocks) == 2 and "search.run(seconds=30)" in blocks[1]
    with inside(folder), contextlib.redirect_stdout(io.StringIO()):
        for block in blocks:
            exec(compile(block.replace("search.run(seconds=30)", "search.run(iterations=8)"),
                         "README.md", "exec"), {})
    assert (folder / "train.py").is_file() and (folder / "train.json").is_file()
