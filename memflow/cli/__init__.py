"""The ``memflow`` command: search, simulate, export, report, list the zoo and the presets, demo.

::

    memflow search   --model resnet50 --batch 256 --cluster 4xV100-16GB --seconds 60 --out plan/
    memflow simulate --model resnet50 --batch 256 --cluster 4xV100-16GB --strategy plan/strategy.json
    memflow export   --model resnet50 --batch 256 --strategy plan/strategy.json --out plan/train.py
    memflow report   plan/                     # plan/report.html, one self-contained file
    memflow zoo | memflow presets              # what --model and --cluster accept
    memflow demo     --out plan/               # the whole job on a model that needs planning

Bad input (an unknown model or preset, a missing file, a factory that fails) ends with one
line ``memflow: error: ...`` and exit status 2, never a traceback.

>>> main(["presets"]) == 0                      # doctest: +ELLIPSIS
name ...
True
>>> main(["simulate", "--model", "nonesuch", "--batch", "8", "--cluster", "1xV100-16GB",
...       "--strategy", "s.json"])        # "memflow: error: unknown zoo model ..." on stderr
2
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from ..errors import MemflowError

__all__ = ["main", "parser"]


class _Parser(argparse.ArgumentParser):
    """argparse's parser, but its errors are the one line every other error is."""

    def error(self, message: str):
        raise MemflowError(f"{message} (see '{self.prog} --help')")


def _model_arguments(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    p.add_argument("--model", required=required,
                   help="a zoo name (see 'memflow zoo') or path/to/file.py:factory")
    p.add_argument("--batch", type=int, required=required, help="global batch size")
    p.add_argument("--option", action="append", metavar="KEY=VALUE",
                   help="a zoo model option (e.g. n_layer=2) or a factory keyword; repeatable")
    p.add_argument("--input-shape", help="one sample's shape, for a factory returning a bare "
                   "model (e.g. 3,224,224)")
    p.add_argument("--units", default="blocks",
                   help="granularity of the graph: blocks (default), leaves or a module depth")


def _cluster_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cluster", required=True,
                   help="a preset such as 4xV100-16GB (see 'memflow presets')")
    p.add_argument("--memory-limit", help="cap every GPU's memory, e.g. 12GB or 80%%")


def parser() -> argparse.ArgumentParser:
    """The argument parser of the ``memflow`` command."""
    from . import commands

    top = _Parser(prog="memflow", description="Plan how to train a deep network when GPU "
                  "memory is the limit.")
    sub = top.add_subparsers(dest="command", required=True, parser_class=_Parser,
                             metavar="{search,simulate,export,report,zoo,presets,demo}")

    p = sub.add_parser("search", help="search for the fastest strategy that fits")
    _model_arguments(p)
    _cluster_arguments(p)
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--seconds", type=float, help="search for this long (default 60)")
    budget.add_argument("--iterations", type=int, help="or make this many proposals")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--optimizer", default="sgd", help="sgd, momentum or adam")
    p.add_argument("--moves", choices=("all", "memory"), default="all",
                   help="memory: change memory policies only, keeping data parallelism (the "
                   "plan then exports as DistributedDataParallel)")
    p.add_argument("--out", default="plan", help="the plan folder (default plan/), checked "
                   "before the search; a plan already there is replaced whole")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(run=commands.search)

    p = sub.add_parser("simulate", help="simulate one training step of a strategy")
    _model_arguments(p)
    _cluster_arguments(p)
    p.add_argument("--strategy", required=True, help="a strategy JSON (plan/strategy.json)")
    p.add_argument("--optimizer", default="sgd", help="sgd, momentum or adam")
    p.set_defaults(run=commands.simulate)

    p = sub.add_parser("export", help="write a torchrun training script for a strategy")
    _model_arguments(p)
    p.add_argument("--strategy", required=True, help="a strategy JSON (plan/strategy.json)")
    p.add_argument("--optimizer", default="sgd", help="sgd, momentum or adam")
    p.add_argument("--out", default="train.py", help="the script to write (default train.py)")
    p.set_defaults(run=commands.export)

    p = sub.add_parser("report", help="write one self-contained HTML report of a plan folder")
    p.add_argument("plan", help="a folder written by 'memflow search'")
    p.add_argument("--out", help="the HTML file (default PLAN/report.html)")
    p.set_defaults(run=commands.report)

    p = sub.add_parser("zoo", help="list the built-in models")
    p.set_defaults(run=commands.zoo)
    p = sub.add_parser("presets", help="list the named clusters")
    p.set_defaults(run=commands.presets)

    p = sub.add_parser("demo", help="the whole job on a built-in model that needs planning")
    p.add_argument("--out", default="plan", help="the plan folder (default plan/)")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--seconds", type=float, default=30.0, help="search time (default 30)")
    budget.add_argument("--iterations", type=int, help="or make this many proposals")
    p.add_argument("--model", default="resnet50", help="a zoo model (default resnet50)")
    p.add_argument("--batch", type=int, help="global batch (default: one that does not fit "
                   "data parallel)")
    p.add_argument("--option", action="append", metavar="KEY=VALUE",
                   help="a zoo model option; repeatable")
    p.add_argument("--cluster", default="4xV100-16GB", help="default 4xV100-16GB")
    p.add_argument("--memory-limit", help="cap every GPU's memory, e.g. 12GB or 80%%")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(run=commands.demo)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``memflow`` command with ``argv`` (default ``sys.argv[1:]``); the exit status."""
    try:
        args = parser().parse_args(argv)
        args.run(args)
    except (MemflowError, OSError) as exc:
        msg = str(exc) if isinstance(exc, MemflowError) else \
            f"{exc.strerror or exc}: {exc.filename}" if exc.filename else str(exc)
        print(f"memflow: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("memflow: interrupted", file=sys.stderr)
        return 130
    return 0
