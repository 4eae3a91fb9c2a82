"""``memflow.export.script``: write a training script that runs a strategy with ``torchrun``.

The script is :mod:`memflow.export.train_template` with its configuration block filled in —
plain, editable PyTorch: ``torch.distributed`` (gloo on CPU, NCCL on GPUs),
``DistributedDataParallel`` over the strategy's data-parallel replicas, the strategy's
policies and placement through :func:`memflow.export.apply`, a synthetic or user-supplied
batch, a tqdm progress bar, ``--steps`` and the loss printed at every step. A strategy that
does not fit the model (other units, a split its shapes or batch do not allow) is refused
before anything is written. It imports memflow
(a dependency of the training job, like torch) rather than copying it, so the exported code is
the same code memflow tests. The strategy's JSON is written beside it.

>>> import tempfile, pathlib
>>> from memflow.strategy import Strategy
>>> s = Strategy([f"layers.{i}" for i in range(2)], devices=[("gpu0", "gpu1")] * 2,
...              sample=[2, 2]).with_policy(recompute=["layers.0", "layers.1"])
>>> out = script(s, pathlib.Path(tempfile.mkdtemp()) / "train.py", model="chain",
...              model_options={"n": 2, "width": 16}, batch_size=8)
>>> sorted(p.name for p in out.parent.iterdir()), "--nproc_per_node 2 train.py" in out.read_text()
(['train.json', 'train.py'], True)
"""
from __future__ import annotations

import ast
import math
import re
from pathlib import Path
from typing import Any, Mapping

from .._jsonio import write_text
from ..errors import ExportError, MemflowError
from ..strategy.runnable import unrunnable
from .factory import build_model, is_file_model, load_callable, takes_batch_size
from .losses import LOSSES
from .multiprocess import across_processes, process_path, processes
from .placement import replicas
from .validation import capture_units

__all__ = ["script", "run_line", "check_fit", "launch_problem"]

_TEMPLATE = Path(__file__).with_name("train_template.py")
_BLOCK = re.compile(r"# ---- configuration \(written by memflow\.export\.script\) ----\n.*?"
                    r"# ---- end of configuration ----\n", re.S)


def run_line(strategy, path: str | Path, *, steps: int = 10,
             batch_size: int | None = None) -> str:
    """The ``torchrun`` command that runs the script ``path`` of ``strategy``: one process per
    data-parallel replica, or per pipeline stage or tensor-parallel shard when the script runs
    the strategy across processes (its ``ACROSS`` setting, :func:`written_path`);
    ``batch_size`` overrides the script's global batch.

    >>> from memflow.strategy import Strategy
    >>> run_line(Strategy(["a"], devices=[("gpu0", "gpu1")], sample=[2]), "plan/train.py",
    ...          batch_size=4)
    'torchrun --standalone --nproc_per_node 2 plan/train.py --steps 10 --batch-size 4'
    """
    n = processes(strategy, written_path(path))
    line = f"torchrun --standalone --nproc_per_node {n} {path} --steps {steps}"
    return line if batch_size is None else f"{line} --batch-size {batch_size}"


_ACROSS = re.compile(r"^ACROSS = (.+?)\s*(#.*)?$", re.M)


def written_path(path: str | Path) -> str | None:
    """The path (:func:`~memflow.export.multiprocess.process_path`) the script at ``path``
    was written for: ``"pipeline"``, ``"tensor"``, or None (whole-model replicas; also for a
    script not written yet)."""
    path = Path(path)
    found = _ACROSS.search(path.read_text()) if path.is_file() else None
    return None if found is None else ast.literal_eval(found.group(1))


def launch_problem(strategy, world: int, batch_size: int,
                   kind: str | None = None) -> str | None:
    """Why ``world`` processes cannot train ``strategy`` at global batch ``batch_size`` (one
    line naming what would be valid), or None. The script asks this before anything starts.

    >>> from memflow.strategy import Strategy
    >>> s = Strategy(["a"], devices=[("gpu0", "gpu1")], sample=[2]).with_schedule(
    ...     microbatches=2, schedule="gpipe")
    >>> launch_problem(s, 2, 8) is None, launch_problem(s, 2, 6)
    (True, "the global batch of 6 does not split over the strategy's 2 replicas x 2 micro-batches; use a multiple of 4 (--batch-size 4)")
    >>> launch_problem(s, 4, 8)
    'the strategy has 2 data-parallel replicas but 4 processes started; run it with torchrun --nproc_per_node 2'
    """
    try:
        n = (replicas(strategy) if kind is None else
             # per-unit degrees: every group's degree splits the batch
             math.lcm(*map(int, strategy.sample)) if kind == "sample" else
             int(strategy.sample[0]))
        want = processes(strategy, kind)
    except MemflowError as exc:
        return str(exc)
    if world != want:
        what = (f"{n} data-parallel replicas" if kind is None else
                f"{want} processes (one per device of its sample groups)" if kind == "sample"
                else f"{want} processes ({kind} parallelism over {n} replicas)")
        return (f"the strategy has {what} but {world} processes started; "
                f"run it with torchrun --nproc_per_node {want}")
    parts = n * strategy.microbatches
    if batch_size < parts or batch_size % parts:
        over = (f"sample degrees {sorted(set(map(int, strategy.sample)))}" if kind == "sample"
                else f"{n} replicas x {strategy.microbatches} micro-batches")
        return (f"the global batch of {batch_size} does not split over the strategy's {over}; "
                f"use a multiple of {parts} "
                f"(--batch-size {parts * max(1, batch_size // parts)})")
    return None


def _model_graph(strategy, model: str, options: Mapping[str, Any], batch_size: int | None):
    """The model's graph at the strategy's units, on meta tensors where the model allows."""
    try:
        made, inputs = build_model(model, batch_size, options)
        return capture_units(made, inputs, strategy)
    except ExportError:
        raise
    except MemflowError as exc:     # a strategy unit that is no module of this model, ...
        raise ExportError(f"strategy {strategy.name!r} does not fit model {model!r}: "
                          f"{exc}") from None


def _path(strategy, graph, model: str, options: Mapping[str, Any], batch_size: int | None):
    """The script's path for ``strategy`` (:func:`~memflow.export.multiprocess.process_path`),
    decided on the model itself (which modules a tensor split shards)."""
    if across_processes(strategy) is None:
        return None
    made, _ = build_model(model, batch_size or int(graph.meta.get("batch_size", 0)) or None,
                          options)
    try:
        return process_path(strategy, made, graph)
    except ExportError as exc:
        raise ExportError(f"strategy {strategy.name!r} cannot run on model {model!r}: "
                          f"{exc}") from None


def check_fit(strategy, graph, model: str, batch_size: int | None = None,
              kind: str | None = None) -> int:
    """Raise :class:`~memflow.errors.ExportError` unless ``strategy`` runs ``graph`` (its
    units, their shapes' splits, the batch over the replicas) on the script's path ``kind``
    (:func:`~memflow.export.multiprocess.process_path`); the batch it trains.

    >>> import memflow
    >>> from memflow.strategy import Strategy
    >>> g = memflow.zoo.graph("chain", batch_size=6, units="blocks", n=2, width=8)
    >>> check_fit(Strategy(["layers.0", "layers.1"], devices=[("gpu0", "gpu1")] * 2,
    ...                    sample=[2, 2]), g, "chain")
    6
    >>> check_fit(Strategy(["layers.0", "layers.1"], devices=[("gpu0", "gpu1")] * 2,
    ...                    sample=[2, 2]), g, "chain", batch_size=8)
    Traceback (most recent call last):
    ...
    memflow.errors.ExportError: strategy 'strategy' does not fit model 'chain': the graph ...
    """
    captured = int(graph.meta.get("batch_size", batch_size or 0))
    if batch_size is not None and captured != batch_size:
        raise ExportError(f"strategy {strategy.name!r} does not fit model {model!r}: the graph "
                          f"was captured at batch {captured}, not {batch_size}; capture it at "
                          "the batch to train")
    try:
        strategy.validate(graph)
    except MemflowError as exc:
        raise ExportError(f"strategy {strategy.name!r} does not fit model {model!r} at batch "
                          f"{captured}: {exc}") from None
    reason = None if kind else unrunnable(strategy, graph)   # e.g. a split export cannot slice
    if reason is not None:
        raise ExportError(f"strategy {strategy.name!r} cannot run on model {model!r}: {reason}")
    problem = launch_problem(strategy, processes(strategy, kind), captured, kind)
    if problem is not None:
        raise ExportError(problem)
    return captured


def script(strategy, path: str | Path, *, model: str, model_options: Mapping[str, Any] | None = None,
           batch_size: int | None = None, optimizer: str = "sgd", lr: float = 0.01,
           loss: str = "auto", devices: Mapping[str, str] | None = None,
           graph=None) -> Path:
    """Write the training script ``path`` and the strategy JSON beside it (``.json``).

    ``model`` is a :mod:`memflow.zoo` name (``model_options`` are its options, e.g. a smaller
    ``n_layer``) or ``"path/to/file.py:factory"``
    (:data:`~memflow.export.factory.FACTORY_CONTRACT`).
    ``batch_size`` is the global batch, split over the replicas (None: the model's own).
    ``devices`` maps the strategy's device names to torch devices (default: ``gpuK`` is
    ``cuda:K``, or ``cpu`` without GPUs). Nothing is written unless the strategy fits the
    model (:func:`check_fit`): ``graph`` is the graph the strategy was made for, else the
    model is captured with the strategy's units. Returns the script's path; run it with
    :func:`run_line`.
    """
    path = Path(path)
    if path.suffix != ".py":
        raise ExportError(f"the training script must be a .py file; got {path.name!r}")
    if optimizer not in ("sgd", "momentum", "adam"):
        raise ExportError(f"optimizer {optimizer!r} is unknown; valid: sgd, momentum, adam")
    if loss not in LOSSES:
        raise ExportError(f"loss {loss!r} is unknown; valid: {', '.join(LOSSES)}")
    options = dict(model_options or {})
    if is_file_model(model):
        file, _, name = model.rpartition(":")
        if not Path(file).is_file():
            raise ExportError(f"model {model!r}: no file {file!r}")
        model = f"{Path(file).resolve()}:{name}"
        if not takes_batch_size(load_callable(model)):
            raise ExportError(f"model {model!r}: the training script gives each replica its "
                              f"share of the batch as {name}(batch_size=...); add a "
                              "batch_size keyword to the factory")
    else:
        from .. import zoo
        zoo.spec_of(model).options(options)   # unknown names fail here, before a capture
    if graph is None:
        graph = _model_graph(strategy, model, options, batch_size)
    kind = _path(strategy, graph, model, options, batch_size)
    batch_size = check_fit(strategy, graph, model, batch_size, kind)
    config = (
        "# ---- configuration (written by memflow.export.script) ----\n"
        f"MODEL = {model!r}\n"
        f"MODEL_OPTIONS: dict = {options!r}\n"
        f"BATCH_SIZE = {int(batch_size)}\n"
        f"STRATEGY = {path.with_suffix('.json').name!r}\n"
        f"OPTIMIZER = {optimizer!r}\n"
        f"LR = {float(lr)!r}\n"
        f"LOSS = {loss!r}\n"
        f"DEVICES: dict = {dict(devices or {})!r}\n"
        f"ACROSS = {kind!r}\n"
        "# ---- end of configuration ----\n")
    n = processes(strategy, kind)
    usage = (f"\nRun: ``torchrun --standalone --nproc_per_node {n} {path.name} --steps 100`` "
             f"(strategy {strategy.name!r}, model {model!r}).\n")
    text = _BLOCK.sub(lambda _: config, _TEMPLATE.read_text(), count=1)
    text = text.replace('"""\nfrom __future__', usage + '"""\nfrom __future__', 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    strategy.to_json(path.with_suffix(".json"))
    write_text(path, text)
    return path
