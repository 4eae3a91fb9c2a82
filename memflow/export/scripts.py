"""``memflow.export.script``: write a training script that runs a strategy with ``torchrun``.

The script is :mod:`memflow.export.train_template` with its configuration block filled in —
plain, editable PyTorch: ``torch.distributed`` (gloo on CPU, NCCL on GPUs),
``DistributedDataParallel`` over the strategy's data-parallel replicas, the strategy's
policies and placement through :func:`memflow.export.apply`, a synthetic or user-supplied
batch, a tqdm progress bar, ``--steps`` and the loss printed at every step. It imports memflow
(a dependency of the training job, like torch) rather than copying it, so the exported code is
the same code memflow tests. The strategy's JSON is written beside it.

>>> import tempfile, pathlib
>>> from memflow.strategy import Strategy
>>> s = Strategy([f"layers.{i}" for i in range(2)], devices=[("gpu0", "gpu1")] * 2,
...              sample=[2, 2]).with_policy(recompute=["layers.0", "layers.1"])
>>> out = script(s, pathlib.Path(tempfile.mkdtemp()) / "train.py", model="chain",
...              model_options={"n": 2, "width": 16}, batch_size=8)
>>> sorted(p.name for p in out.parent.iterdir()), "torchrun --nproc_per_node 2" in out.read_text()
(['train.json', 'train.py'], True)
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping

from .._jsonio import write_text
from ..errors import ExportError
from .placement import replicas

__all__ = ["script"]

_TEMPLATE = Path(__file__).with_name("train_template.py")
_BLOCK = re.compile(r"# ---- configuration \(written by memflow\.export\.script\) ----\n.*?"
                    r"# ---- end of configuration ----\n", re.S)


def script(strategy, path: str | Path, *, model: str, model_options: Mapping[str, Any] | None = None,
           batch_size: int = 8, optimizer: str = "sgd", lr: float = 0.01, loss: str = "auto",
           devices: Mapping[str, str] | None = None) -> Path:
    """Write the training script ``path`` and the strategy JSON beside it (``.json``).

    ``model`` is a :mod:`memflow.zoo` name (``model_options`` are its options, e.g. a smaller
    ``n_layer``) or ``"path/to/file.py:factory"`` with ``factory(batch_size=..., **options)``
    returning ``(model, example_inputs)`` like :func:`memflow.zoo.get`. ``batch_size`` is
    the global batch, split over the replicas. ``devices`` maps the strategy's device names to
    torch devices (default: ``gpuK`` is ``cuda:K``, or ``cpu`` without GPUs). Returns the
    script's path; run it with ``torchrun --nproc_per_node <replicas> <path> --steps N``.
    """
    path = Path(path)
    if path.suffix != ".py":
        raise ExportError(f"the training script must be a .py file; got {path.name!r}")
    if optimizer not in ("sgd", "momentum", "adam"):
        raise ExportError(f"optimizer {optimizer!r} is unknown; valid: sgd, momentum, adam")
    if loss not in ("auto", "cross_entropy", "mse"):
        raise ExportError(f"loss {loss!r} is unknown; valid: auto, cross_entropy, mse")
    n = replicas(strategy)
    if batch_size % n:
        raise ExportError(f"batch_size {batch_size} does not split over the strategy's {n} "
                          f"data-parallel replicas; use a multiple of {n}")
    if ".py:" in model:
        file, _, name = model.rpartition(":")
        if not Path(file).is_file():
            raise ExportError(f"model {model!r}: no file {file!r}")
        model = f"{Path(file).resolve()}:{name}"
    else:
        from .. import zoo
        zoo.spec_of(model).options(dict(model_options or {}))   # unknown names fail here
    config = (
        "# ---- configuration (written by memflow.export.script) ----\n"
        f"MODEL = {model!r}\n"
        f"MODEL_OPTIONS: dict = {dict(model_options or {})!r}\n"
        f"BATCH_SIZE = {int(batch_size)}\n"
        f"STRATEGY = {path.with_suffix('.json').name!r}\n"
        f"OPTIMIZER = {optimizer!r}\n"
        f"LR = {float(lr)!r}\n"
        f"LOSS = {loss!r}\n"
        f"DEVICES: dict = {dict(devices or {})!r}\n"
        "# ---- end of configuration ----\n")
    usage = (f"\nRun: ``torchrun --nproc_per_node {n} {path.name} --steps 100`` "
             f"(strategy {strategy.name!r}, model {model!r}).\n")
    text = _BLOCK.sub(lambda _: config, _TEMPLATE.read_text(), count=1)
    text = text.replace('"""\nfrom __future__', usage + '"""\nfrom __future__', 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    strategy.to_json(path.with_suffix(".json"))
    write_text(path, text)
    return path
