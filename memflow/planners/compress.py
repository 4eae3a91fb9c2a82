"""Error-bounded lossy compression of saved activations, as COMET does (Jin et al., VLDB 2022).

Every unit that saves something for backward gets the ``compress`` policy with one error bound:
its saved tensors are held at ``1 / ratio(error_bound)`` of their size between its forward and
its backward, at the cost of a compress and a decompress task on its device. COMET tunes the
error bound and then spends the memory saved on a larger batch; :func:`compress` reports, per
error bound:

* the compression ratio the simulator charges (:func:`memflow.sim.cpu_time.compress_model`: that
  of the compressor the exported step runs — memflow's quantizer on a GPU, SZ3 on a CPU where
  pysz is installed — for each saved map's kind, :mod:`memflow.graph.mapkind`) and, when asked, the ratio and throughput
  measured on the real feature maps of a model — with SZ3 as COMET (``pysz`` installed) or
  the quantizer (without it; the ``compressor`` column says which) — and the gradient error
  of one real training step (:mod:`memflow.planners.compress_measure`);
* the activation memory and the peak with and without compression, and the step time;
* with ``adapt_batch``, the largest batch that fits the device with and without compression.

:func:`compress_strategy` is the strategy itself, under memflow's infeasible convention.

>>> from memflow.search.synthetic import chain_graph
>>> g = chain_graph(4, width=4096, batch=16384, seed=None)
>>> compress_strategy(g, "1xV100-16GB", error_bound=1e-2).policies
['compress', 'compress', 'compress', 'compress']
>>> t = compress(g, "jetson-nano-4GB", error_bound=[1e-2], measure=False)
>>> bool(t.loc[1e-2, "max_batch"] > t.loc[1e-2, "max_batch_keep"])
True
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

import numpy as np
import pandas as pd

from ..errors import PlanError
from ..graph.mapkind import UNCOMPRESSED
from ..sim import Evaluator, estimate
from ..sim.cpu_time import cpu_figures, step_compressor, step_ratio
from ..strategy import Strategy
from .batch import graph_source
from .common import Infeasible, as_cluster, as_limit, check_graph, fastest

__all__ = ["compress", "compress_strategy", "largest_batch", "ERROR_BOUNDS"]

ERROR_BOUNDS = (1e-4, 1e-3, 1e-2, 1e-1)
_MAX_BATCH = 1 << 16


def _policy(graph, device: str, error_bound: float | None) -> Strategy:
    s = Strategy.single_device(graph, device)
    if error_bound is None:
        return s
    if not error_bound > 0:
        raise PlanError(f"compress: error_bound must be > 0, got {error_bound!r}")
    units = [u for u, b in zip(graph.names, graph.units["saved_bytes"]) if b > 0]
    return s.with_policy({u: ("compress", float(error_bound)) for u in units}).with_schedule(
        name=f"compress eb={error_bound:g} (COMET)")


def compress_strategy(graph, cluster: Any, *, error_bound: float = 1e-2,
                      memory_limit: Any = None, optimizer: str = "sgd") -> Strategy:
    """Every unit's saved tensors compressed within ``error_bound``, on the cluster's first
    device; :class:`~memflow.planners.common.Infeasible` when that does not fit."""
    check_graph(graph, "compress")
    c = as_cluster(cluster)
    dev = str(c.devices.index[0])
    limit = as_limit(memory_limit, c, [dev])
    ev = Evaluator(graph, c, limit, optimizer=optimizer)
    return fastest(ev, [_policy(graph, dev, error_bound)], "compress", f"eb={error_bound:g}",
                   limit).strategy


def largest_batch(source: Callable[[int], Any], cluster, make: Callable[[Any], Strategy],
                  limit: float, start: int, optimizer: str = "sgd") -> int:
    """The largest batch whose strategy ``make(graph_at_batch)`` fits ``limit`` (0 if none)."""
    def fits(b: int) -> bool:
        g = source(b)
        return Evaluator(g, cluster, limit, optimizer=optimizer)(make(g)).fits

    if not fits(1):
        return 0
    lo = 1
    hi = max(int(start), 2)
    while fits(hi):                    # grow until it no longer fits
        lo, hi = hi, hi * 2
        if hi > _MAX_BATCH:
            return lo
    while hi - lo > 1:                 # lo fits, hi does not
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def compress(graph, cluster: Any, *, error_bound: float | Iterable[float] = ERROR_BOUNDS,
             memory_limit: Any = None, adapt_batch: bool = True, measure: Any = None,
             measure_options: dict | None = None, optimizer: str = "sgd",
             compressor: str | None = None) -> pd.DataFrame:
    """COMET's trade-off per error bound (absolute), on the cluster's first device.

    ``measure``: a zoo model name or ``(model, inputs)`` whose real feature maps and gradients
    are measured (default: the graph's zoo model, ``graph.meta["model"]``; False to skip);
    ``measure_options`` go to the zoo model (e.g. ``{"image_size": 112}``) and
    ``batch_size`` of the measurement; ``compressor`` the one measured (default: SZ3 when
    pysz is installed, else memflow's quantizer; :func:`memflow.compress.choose`).

    Columns: ``sim_ratio`` (the saved maps' kinds weighted by bytes) and ``sim_compressor``; ``activations_keep``, ``activations`` (bytes, largest over the
    step), ``activation_reduction``; ``peak_keep``, ``peak``, ``memory_reduction`` (total
    peak); ``time_keep``, ``time``; ``fits``; with ``adapt_batch`` ``max_batch_keep``,
    ``max_batch`` and ``batch_gain``; when measured ``measured_ratio``, ``throughput`` (bytes/s
    of this CPU), ``max_error``, ``grad_rel_error`` and ``compressor``.
    """
    check_graph(graph, "compress")
    c = as_cluster(cluster)
    dev = str(c.devices.index[0])
    limit = as_limit(memory_limit, c, [dev])
    try:
        bounds = ([float(error_bound)] if np.isscalar(error_bound)
                  else [float(e) for e in error_bound])
    except (TypeError, ValueError):
        raise PlanError(f"compress: error_bound must be a positive number or a list of them "
                        f"(absolute bounds such as 1e-2), got {error_bound!r}") from None
    if not bounds:
        raise PlanError("compress: give at least one error bound")
    ev = Evaluator(graph, c, limit, optimizer=optimizer)
    keep = _policy(graph, dev, None)
    ref = ev(keep)
    act_keep = _activations(graph, c, keep, optimizer)
    on_cpu = cpu_figures(c) is not None         # what the simulator charges: the step's own
    ratio_of = step_ratio(on_cpu, graph.meta.get("map_bits"))
    source = graph_source(graph)
    batch = int(graph.meta["batch_size"])
    if adapt_batch:
        keep_batch = largest_batch(source, c, lambda g: _policy(g, dev, None), limit, batch,
                                   optimizer)
    rows = []
    for eb in bounds:
        s = _policy(graph, dev, eb)
        out = ev(s)
        act = _activations(graph, c, s, optimizer)
        row = {"error_bound": eb, "sim_ratio": _saved_ratio(graph, ratio_of, eb),
               "sim_compressor": step_compressor(on_cpu),
               "activations_keep": act_keep, "activations": act,
               "activation_reduction": act_keep / act if act else np.inf,
               "peak_keep": ref.peak, "peak": out.peak, "memory_reduction": ref.peak / out.peak,
               "time_keep": ref.time, "time": out.time, "fits": out.fits}
        if adapt_batch:
            most = largest_batch(source, c, lambda g, eb=eb: _policy(g, dev, eb), limit, batch,
                                 optimizer)
            row.update(max_batch_keep=keep_batch, max_batch=most,
                       batch_gain=most / keep_batch if keep_batch else np.inf)
        rows.append(row)
    df = pd.DataFrame(rows).set_index("error_bound")
    if measure is None:
        measure = graph.meta.get("model")
    if measure is not False and measure is not None:
        df = df.join(_measured(measure, bounds, {**(measure_options or {}),
                                                 "compressor": compressor}))
    df.attrs.update(limit=limit, device=c.name, strategies={eb: _policy(graph, dev, eb)
                                                             for eb in bounds})
    return df


def _saved_ratio(graph, ratio_of: Callable[..., float], eb: float) -> float:
    """The ratio the simulator charges the graph's saved floating maps at ``eb`` (what
    ``measured_ratio`` covers): each kind at its own (:mod:`memflow.graph.mapkind`), weighted
    by its bytes. Integers (a max-pool's indices) are held as they are, outside it."""
    t = graph.tensors
    saved = t[(t["savers"].map(len) > 0) & ~t["map_kind"].isin(UNCOMPRESSED)]
    by_kind = saved.groupby("map_kind")["bytes"].sum()
    packed = sum(b / ratio_of(eb, "float32", k) for k, b in by_kind.items())
    return float(by_kind.sum() / packed) if packed else 1.0


def _activations(graph, cluster, strategy: Strategy, optimizer: str) -> float:
    """Largest activation bytes over the step (memflow.estimate's ``activations`` maximum)."""
    return float(estimate(graph, cluster, strategy=strategy, optimizer=optimizer)
                 .loc["activations", "max"])


def _measured(source: Any, bounds: list[float], options: dict) -> pd.DataFrame:
    from .compress_measure import feature_map_ratios, gradient_error
    maps = feature_map_ratios(source, bounds, **options)
    grads = gradient_error(source, bounds, **options)
    return pd.DataFrame({"measured_ratio": maps["ratio"], "throughput": maps["throughput"],
                         "max_error": maps["max_error"], "grad_rel_error": grads["rel_error"],
                         "compressor": maps["compressor"]})
