"""What error-bounded compression does to real feature maps and to gradients, measured.

Both functions run a real PyTorch model on CPU (a zoo model by name, shrunk by keyword options
where the full one is too big for a quick run, or any ``(model, inputs)``):

* :func:`feature_map_ratios` collects every floating tensor autograd saves in one forward
  (parameters excluded, each storage once) and compresses them (:func:`memflow.compress.compress`:
  SZ3, as COMET, when pysz is installed, else memflow's own quantizer; ``compressor`` picks)
  at each error bound: the compression ratio over all of them, the compressor's throughput on
  this machine, and the largest error reached;
* :func:`gradient_error` trains one step with and without
  :class:`memflow.compress.compressed_saved_tensors` and compares the parameter gradients;
* :func:`map_bits` measures, per map kind (:mod:`memflow.graph.mapkind`), the bits per
  element the step's compressor packs the model's own saved maps into: set as the graph's
  ``meta["map_bits"]``, it is what the memory model charges that model's compressed records
  instead of the zoo-wide figures of :data:`memflow.compress.model.BY_KIND`.

The weights are random (nothing is downloaded), so feature maps have the statistics of an
untrained network on random inputs: ratios on trained networks and real data differ.

>>> import torch
>>> torch.manual_seed(0) and None
>>> net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
>>> x = torch.randn(128, 64)
>>> t = feature_map_ratios((net, (x,)), [1e-2])
>>> row = t.loc[1e-2]
>>> int(row["tensors"]), bool(row["max_error"] <= 1e-2), bool(row["ratio"] > 2)
(2, True, True)
>>> e = gradient_error((net, (x,)), [1e-4, 1e-1])
>>> bool(e.loc[1e-4, "rel_error"] < e.loc[1e-1, "rel_error"] < 0.5)
True
"""
from __future__ import annotations

import time
from typing import Any, Iterable

import numpy as np
import pandas as pd
import torch

from ..compress import choose, compress, compressed_saved_tensors, decompress
from ..errors import PlanError
from ..graph.capture import split_inputs
from ..graph.mapkind import UNCOMPRESSED, saved_maps

__all__ = ["feature_map_ratios", "gradient_error", "real_model", "map_bits"]


def real_model(source: Any, batch_size: int = 2, **cfg: Any) -> tuple[torch.nn.Module, tuple]:
    """``(model, inputs)`` on CPU: ``source`` itself, or zoo model ``source`` built with ``cfg``."""
    if isinstance(source, str):
        from .. import zoo
        return zoo.get(source, batch_size, device="cpu", **cfg)
    if isinstance(source, tuple) and len(source) == 2 and isinstance(source[0], torch.nn.Module):
        return source[0], tuple(source[1])
    raise PlanError(f"expected a zoo model name or a (model, inputs) pair, got {source!r}")


def _loss(out: Any) -> torch.Tensor:
    first = out[0] if isinstance(out, (tuple, list)) else out   # inception returns aux logits
    return first.float().pow(2).mean()


def feature_map_ratios(source: Any, error_bounds: Iterable[float], *, batch_size: int = 2,
                       compressor: str | None = None, **cfg: Any) -> pd.DataFrame:
    """Per error bound (absolute): ``tensors``, ``bytes`` (original), ``ratio`` (original over
    compressed bytes, all saved tensors together), ``throughput`` and
    ``decompress_throughput`` (bytes/s on this machine's CPU), ``max_error`` and
    ``compressor`` (which one ran: see :func:`memflow.compress.choose`)."""
    compressor = choose("cpu", compressor)
    model, inputs = real_model(source, batch_size, **cfg)
    maps = [t for t, _ in saved_maps(model, *inputs)]
    if not maps:
        raise PlanError("the model saved no floating activations to compress")
    total = sum(t.numel() * t.element_size() for t in maps)
    rows = []
    for eb in error_bounds:
        packed_bytes, t_c, t_d, worst = 0, 0.0, 0.0, 0.0
        for t in maps:
            start = time.perf_counter()
            p = compress(t, float(eb), compressor=compressor)
            mid = time.perf_counter()
            back = decompress(p)
            t_c += mid - start
            t_d += time.perf_counter() - mid
            packed_bytes += p.nbytes
            finite = torch.isfinite(t)
            worst = max(worst, float((back.double() - t.double()).abs()[finite].max()))
        rows.append({"error_bound": float(eb), "tensors": len(maps), "bytes": total,
                     "ratio": total / packed_bytes, "throughput": total / t_c,
                     "decompress_throughput": total / t_d, "max_error": worst,
                     "compressor": compressor})
    return pd.DataFrame(rows).set_index("error_bound")


def gradient_error(source: Any, error_bounds: Iterable[float], *, batch_size: int = 4,
                   seed: int = 0, compressor: str | None = None, **cfg: Any) -> pd.DataFrame:
    """Per error bound: ``rel_error`` (‖g_c − g‖ / ‖g‖ over all parameter gradients),
    ``cosine`` (their cosine similarity) and ``ratio`` (saved bytes compressed), one training
    step with every saved activation compressed against the same step without."""
    model, inputs = real_model(source, batch_size, **cfg)

    def grads(eb: float | None) -> tuple[torch.Tensor, float]:
        model.zero_grad(set_to_none=True)
        with torch.random.fork_rng(devices=[]):     # dropout draws the same masks each run
            torch.manual_seed(seed)
            if eb is None:
                _loss(model(*inputs)).backward()
                ratio = 1.0
            else:
                with compressed_saved_tensors(eb, compressor=compressor) as hooks:
                    loss = _loss(model(*inputs))
                loss.backward()
                ratio = hooks.ratio
        flat = torch.cat([p.grad.double().flatten() for p in model.parameters()
                          if p.grad is not None])
        return flat, ratio

    ref, _ = grads(None)
    rows = []
    for eb in error_bounds:
        g, ratio = grads(float(eb))
        rows.append({"error_bound": float(eb),
                     "rel_error": float((g - ref).norm() / ref.norm()),
                     "cosine": float(torch.nn.functional.cosine_similarity(g, ref, dim=0)),
                     "ratio": ratio})
    return pd.DataFrame(rows).set_index("error_bound").astype(np.float64)


def map_bits(model: torch.nn.Module, inputs: Any, *,
             error_bounds: Iterable[float] = (1e-4, 1e-3, 1e-2, 1e-1),
             compressor: str | None = None, sample: int = 1 << 22) -> dict:
    """Bits per element the compressor packs ``model``'s own saved maps into, per map kind,
    measured on one real forward at the weights it has now: what a compressed record of that
    kind costs this model, before any exported run (``graph.meta["map_bits"]``, read by
    :func:`memflow.estimate`, the simulator and the planners).

    ``inputs`` as for :func:`memflow.from_torch` (a tensor, a tuple or a dict). The forward runs on a
    copy (batch norm's running statistics stay as they are) with the random state restored
    after it; each map is compressed whole up to ``sample`` elements, else its first
    ``sample`` (weighted by its whole size). ``compressor``: the one the step runs
    (:func:`memflow.compress.choose` for the CPU by default; the memory model uses the figures
    only for that compressor). Returns ``{"compressor": name, "bits": {kind: [[bound, bits],
    ...]}}`` (JSON-ready: it is saved with the graph), ``"all"`` pooling every kind.

    >>> net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU())
    >>> m = map_bits(net, torch.randn(256, 64), error_bounds=[1e-2], compressor="quantizer")
    >>> sorted(m["bits"]), 4 < m["bits"]["rectified"][0][1] < 16
    (['all', 'rectified', 'signed'], True)
    """
    import copy

    compressor = choose("cpu", compressor)
    args, kwargs = split_inputs(inputs)
    with torch.random.fork_rng(devices=[]):
        maps = [(t, k) for t, k in saved_maps(copy.deepcopy(model), *args, kwargs=kwargs)
                if k not in UNCOMPRESSED]
    if not maps:
        raise PlanError("the model saved no floating activations to compress")
    bits: dict[str, list[list[float]]] = {}
    for eb in sorted(float(e) for e in error_bounds):
        by_kind: dict[str, list[float]] = {}
        for t, kind in maps:
            part = t.reshape(-1)[:sample]
            packed = compress(part, eb, compressor=compressor)
            for k in (kind, "all"):      # bits of the part, counted for the whole map
                acc = by_kind.setdefault(k, [0.0, 0.0])
                acc[0] += 8 * packed.nbytes * t.numel() / part.numel()
                acc[1] += t.numel()
        for k, (b, n) in by_kind.items():
            bits.setdefault(k, []).append([eb, b / n])
    return {"compressor": compressor, "bits": bits}
