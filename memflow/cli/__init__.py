"""The ``memflow`` command: search, simulate, export, report, list the zoo and the presets, demo.

::

    memflow search   --model resnet50 --batch 256 --cluster 4xV100-16GB --seconds 60 --out plan/
    memflow simulate --model resnet50 --batch 256 --cluster 4xV100-16GB --strategy plan/strategy.json
    memflow export   --model resnet50 --batch 256 --strategy plan/strategy.json --out plan/train.py
                     # checks the strategy against the model, prints the torchrun line
    memflow report   plan/                     # plan/report.html, one self-contained file
    memflow zoo | memflow presets              # what --model and --cluster accept
    memflow demo     --out plan/               # the whole job on a model that needs planning

Bad input (an unknown model or preset, a missing or malformed file, a factory that fails)
ends with one line ``memflow: error: ...`` and exit status 2, never a traceback; a search
whose best strategy does not fit exits with status 3 after writing the plan, saying by how
much it misses (:data:`memflow.cli.commands.EXIT_STATUS`).

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
import textwrap
from typing import Sequence

from ..errors import MemflowError

__all__ = ["main", "parser"]


class _Parser(argparse.ArgumentParser):
    """argparse's parser, but its errors are the one line every other error is."""

    def error(self, message: str):
        raise MemflowError(f"{message} (see '{self.prog} --help')")


def _model_arguments(p: argparse.ArgumentParser, *, units: bool = True) -> None:
    p.add_argument("--model", required=True,
                   help="a zoo name (see 'memflow zoo') or path/to/model.py:make (below)")
    p.add_argument("--batch", type=int, help="global batch size (default: the model's own: "
                   "the zoo's, or the batch of the inputs the factory returns)")
    p.add_argument("--option", action="append", metavar="KEY=VALUE",
                   help="a zoo model option (e.g. n_layer=2) or a factory keyword; repeatable")
    p.add_argument("--input-shape", help="one sample's shape, for a factory returning a bare "
                   "model (e.g. 3,224,224)")
    if units:
        p.add_argument("--units", default="blocks",
                       help="granularity of the graph: blocks (default), leaves or a module depth")


def _cluster_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cluster", required=True,
                   help="a preset such as 4xV100-16GB (see 'memflow presets')")
    p.add_argument("--memory-limit", help="cap every GPU's memory, e.g. 12GB or 80%%")


_EXAMPLES = {
    "search": ["memflow search --model resnet50 --batch 256 --cluster 4xV100-16GB --seconds 60 "
               "--out plan/",
               "memflow search --model path/to/model.py:make --option width=64 "
               "--cluster 2xA100-40GB --iterations 500 --out myplan/"],
    "simulate": ["memflow simulate --model resnet50 --batch 256 --cluster 4xV100-16GB "
                 "--strategy plan/strategy.json"],
    "export": ["memflow export --model resnet50 --batch 256 --strategy plan/strategy.json "
               "--out plan/train.py"],
    "report": ["memflow report plan/                 # writes plan/report.html"],
    "zoo": ["memflow zoo"],
    "presets": ["memflow presets"],
    "demo": ["memflow demo --seconds 10 --out plan/",
             "memflow demo --model vgg16 --batch 512 --cluster 2xV100-32GB --memory-limit 75%"],
}
"""An example command line of each subcommand, shown by its ``--help``."""

_WITH_MODEL = ("search", "simulate", "export")


def _epilog(*examples: str, contract: bool = False) -> str:
    text = "examples:\n" + "".join(f"  {line}\n" for line in examples)
    if contract:
        from ..export.factory import FACTORY_CONTRACT
        text += "\n" + textwrap.fill(FACTORY_CONTRACT, 88) + "\n"
    return text


def _command(sub, command: str, summary: str, note: str = "") -> argparse.ArgumentParser:
    """A subcommand whose ``--help`` ends with its examples (and the factory contract where
    it takes --model), then ``note``."""
    epilog = _epilog(*_EXAMPLES[command], contract=command in _WITH_MODEL)
    if note:
        epilog += "\n" + textwrap.fill(note, 88) + "\n"
    return sub.add_parser(command, help=summary, epilog=epilog,
                          formatter_class=argparse.RawDescriptionHelpFormatter)


def parser() -> argparse.ArgumentParser:
    """The argument parser of the ``memflow`` command."""
    from . import commands

    statuses = "\n".join(f"  {code:<4} {text}" for code, text in commands.EXIT_STATUS.items())
    top = _Parser(prog="memflow", description="Plan how to train a deep network when GPU "
                  "memory is the limit.", formatter_class=argparse.RawDescriptionHelpFormatter,
                  epilog=_epilog(*(lines[0] for lines in _EXAMPLES.values()))
                  + f"\nexit status:\n{statuses}")
    sub = top.add_subparsers(dest="command", required=True, parser_class=_Parser,
                             metavar="{search,simulate,export,report,zoo,presets,demo}")

    p = _command(sub, "search", "search for the fastest strategy that fits",
                 note=f"exit status: 0 the best strategy fits; {commands.INFEASIBLE} none found "
                 "fits (the plan is written anyway, and one line says by how much it misses); "
                 "2 bad input")
    _model_arguments(p)
    _cluster_arguments(p)
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--seconds", type=float, help="search for this long (default 60)")
    budget.add_argument("--iterations", type=int, help="or make this many proposals")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--optimizer", default="sgd", help="sgd, momentum or adam")
    p.add_argument("--moves", choices=("all", "memory"), default="all",
                   help="all: placement, splits, data-parallel degree and memory policies, "
                   "every proposal one export runs (docs/export.md); memory: memory policies "
                   "only, over data parallelism")
    p.add_argument("--out", default="plan", help="the plan folder (default plan/), checked "
                   "before the search; a plan already there is replaced whole")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(run=commands.search)

    p = _command(sub, "simulate", "simulate one training step of a strategy")
    _model_arguments(p)
    _cluster_arguments(p)
    p.add_argument("--strategy", required=True, help="a strategy JSON (plan/strategy.json)")
    p.add_argument("--optimizer", default="sgd", help="sgd, momentum or adam")
    p.set_defaults(run=commands.simulate)

    p = _command(sub, "export", "write a torchrun training script for a strategy")
    _model_arguments(p, units=False)     # the strategy's units are the ones captured
    p.add_argument("--strategy", required=True, help="a strategy JSON (plan/strategy.json)")
    p.add_argument("--optimizer", default="sgd", help="sgd, momentum or adam")
    p.add_argument("--out", default="train.py", help="the script to write (default train.py)")
    p.set_defaults(run=commands.export)

    p = _command(sub, "report", "write one self-contained HTML report of a plan folder")
    p.add_argument("plan", help="a folder written by 'memflow search'")
    p.add_argument("--out", help="the HTML file (default PLAN/report.html)")
    p.set_defaults(run=commands.report)

    p = _command(sub, "zoo", "list the built-in models")
    p.set_defaults(run=commands.zoo)
    p = _command(sub, "presets", "list the named clusters")
    p.set_defaults(run=commands.presets)

    p = _command(sub, "demo", "the whole job on a built-in model that needs planning")
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
        status = args.run(args)
    except (MemflowError, OSError) as exc:
        msg = str(exc) if isinstance(exc, MemflowError) else \
            f"{exc.strerror or exc}: {exc.filename}" if exc.filename else str(exc)
        print(f"memflow: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("memflow: interrupted", file=sys.stderr)
        return 130
    return status or 0
