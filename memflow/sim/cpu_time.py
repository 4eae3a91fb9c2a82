"""The time model of a CPU measured here, and of activation compression
(``docs/data-model.md``, "Time model").

A CPU device of ``Cluster.local()`` carries its measured step figures (:func:`cpu_figures`):
its units' compute (:func:`cpu_compute`), saved-tensor hooks (:func:`cpu_hooks`) and optimizer
step (:func:`cpu_optimizer`) are charged from them, op after op, instead of the roofline. The
compressor an exported step runs (:func:`step_compressor`), its ratios and its throughput
(:func:`compress_model`) are here too: on a CPU they are measured in this process.
"""
from __future__ import annotations

import json
from functools import lru_cache
from typing import Callable

import numpy as np
import pandas as pd

from ..hardware.efficiency import efficiency
from ..strategy.policies import M_COMPRESSED, POLICIES

__all__ = ["compress_model", "compression_ratios", "step_compressor", "step_ratio", "CPU_FIGURES",
           "cpu_figures", "cpu_compute", "cpu_optimizer", "parameter_tensors",
           "cpu_compressor_cost", "compressed_maps", "COMPRESSOR_MAPS", "kernel_rate",
           "saved_tensors", "cpu_hooks"]


def compress_model(clock: str | None = None
                   ) -> tuple[Callable[..., float], Callable[..., float], Callable[..., float],
                              Callable[..., float]]:
    """``(expected_ratio, throughput, launches, per_call)`` of activation compression, from
    :mod:`memflow.compress` (imported on first use: it loads torch). ``expected_ratio(eb,
    dtype, kind)`` is the ratio of the compressor the exported step runs: the quantizer on
    a GPU; on a CPU measured here (``clock``: the cluster's, see :func:`cpu_figures`)
    :func:`memflow.compress.choose`'s (SZ3 where pysz is installed), whose throughput is then
    its own, measured per map kind (:func:`cpu_compressor_cost`; ``throughput`` and
    ``per_call`` then take ``kind=``), not the GPU quantizer's memory traffic.
    ``launches(bits, decompress=)`` counts a GPU quantizer's kernels (charged at the device's
    launch overhead); ``per_call(decompress=, error_bound=)`` is the seconds each call on
    one saved tensor costs beyond its bytes: on a CPU the measured fixed cost (SZ3's
    configuration, its stream's allocation, the quantizer's range scan of a tiny map), 0 on
    a GPU, whose fixed cost is its launches."""
    from ..compress.model import launches, throughput
    if clock is None:
        return step_ratio(False), throughput, launches, lambda **_: 0.0

    def measured(_mem_rate: float, *, decompress: bool = False, error_bound: float = 1e-2,
                 kind: str = "rectified") -> float:
        return cpu_compressor_cost(error_bound, decompress, clock, kind)[0] * efficiency(
            "cpu", "compress_rate")

    def per_call(*, decompress: bool = False, error_bound: float = 1e-2,
                 kind: str = "rectified") -> float:
        return cpu_compressor_cost(error_bound, decompress, clock, kind)[1] / efficiency(
            "cpu", "compress_call_overhead")
    return step_ratio(True), measured, lambda bits, decompress=False: 0.0, per_call


def step_compressor(on_cpu: bool) -> str:
    """The compressor an exported step runs on its maps: :func:`memflow.compress.choose`'s
    for a CPU tensor (SZ3 where pysz is installed), the quantizer on a GPU."""
    from ..compress import choose
    return choose("cpu" if on_cpu else "cuda")


def step_ratio(on_cpu: bool, measured: dict | None = None) -> Callable[..., float]:
    """``ratio(eb, dtype="float32", kind=None)``: :func:`memflow.compress.expected_ratio` of
    the compressor a step on a CPU (``on_cpu``) or a GPU runs (:func:`step_compressor`), for
    maps of ``kind`` (all maps pooled when None). ``measured``: the graph's
    ``meta["map_bits"]`` (:func:`memflow.planners.compress_measure.map_bits`), used where it
    was measured with that compressor. memflow.compress (torch) loads on the first call."""
    def ratio(error_bound: float, dtype: str = "float32", kind: str | None = None) -> float:
        from ..compress.model import expected_ratio
        compressor = step_compressor(on_cpu)
        own = measured and measured["compressor"] == compressor
        return expected_ratio(error_bound, dtype, compressor=compressor, kind=kind,
                              measured={k: dict(map(tuple, v)) for k, v in
                                        measured["bits"].items()} if own else None)
    return ratio


COMPRESSOR_MAPS = ((8, 32, 32, 32), (1, 4, 32, 32))
"""The shapes of the maps :func:`cpu_compressor_cost` times: 1 MiB and 16 KiB of fp32 (an
mlp's or a small block's map: where the fixed cost shows)."""


def _sample_map(kind: str, shape: tuple[int, ...]):
    """A synthetic map of ``kind`` (:data:`~memflow.graph.mapkind.MAP_KINDS`): SZ3's speed
    follows the values (a ReLU map's zeros and outliers take it about half as fast as a
    signed one), so each kind is timed on its own."""
    import torch
    F = torch.nn.functional
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    made = {"signed": lambda: x, "normalized": lambda: F.layer_norm(x, shape[-1:]),
            "rectified": lambda: x.relu(),
            "normalized-rectified": lambda: F.layer_norm(x, shape[-1:]).relu(),
            "probability": lambda: x.softmax(-1)}
    return made[kind]()


@lru_cache(maxsize=None)
def cpu_compressor_cost(error_bound: float, decompress: bool, clock: str = "cpu",
                        kind: str = "rectified") -> tuple[float, float]:
    """``(bytes per second, seconds per call)`` of export's compressor
    (:func:`memflow.compress.compress`: SZ3 where pysz is installed) packing, or unpacking, a
    feature map of ``kind`` (:func:`_sample_map`) on one thread of this machine, timed by
    ``clock`` ("cpu": the process's CPU time; "wall"): a line through the times of the two
    maps of :data:`COMPRESSOR_MAPS`, each the mean over a window. A call costs its fixed
    part (SZ3's configuration, its stream's allocation, the reconstruction it checks)
    whatever the map's size; on a 64 KiB map that is most of it, so one rate through a large
    map's time undercharges small maps by several times. Measured once per process and
    kind, in about half a second (memflow.compress sits beside memflow.hardware, not under
    it, so ``Cluster.local()``'s micro-benchmark cannot run it).

    >>> rate, per_call = cpu_compressor_cost(1e-2, False)
    >>> rate > 0 and per_call >= 0
    True
    """
    import time

    import torch

    from ..compress import compress, decompress as unpack
    clock_of = time.process_time if clock == "cpu" else time.perf_counter
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        points = []
        for shape in COMPRESSOR_MAPS:
            x = _sample_map(kind, shape)
            packed = compress(x, error_bound)
            run = (lambda: unpack(packed)) if decompress else (lambda: compress(x, error_bound))
            run()
            calls, t0 = 0, clock_of()
            while calls < 3 or clock_of() - t0 < 0.1:
                run()
                calls += 1
            points.append((x.numel() * x.element_size(), max(clock_of() - t0, 1e-9) / calls))
        (big, t_big), (small, t_small) = points
        per_byte = max(t_big - t_small, 1e-12) / (big - small)
        return 1.0 / per_byte, max(t_small - small * per_byte, 0.0)
    finally:
        torch.set_num_threads(before)


def compressed_maps(graph) -> tuple[np.ndarray, np.ndarray]:
    """Per unit, the saved storages a compressing unit's hook packs — one compressor call
    each, and one to unpack — and their bytes by map kind (``(units, len(MAP_KINDS))``):
    the floating ones it saves first (a storage saved again is packed once; integers and
    masks, :data:`~memflow.graph.mapkind.UNCOMPRESSED`, stay as they are)."""
    from ..graph.mapkind import MAP_KINDS, UNCOMPRESSED
    t = graph.tensors
    kind = t["map_kind"] if "map_kind" in t.columns else pd.Series("signed", index=t.index)
    packed = t[~kind.isin(UNCOMPRESSED) & t["first_saver"].notna()]
    calls = packed["first_saver"].value_counts().reindex(graph.names, fill_value=0)
    by_kind = (packed.assign(kind=kind[packed.index]).pivot_table(
        index="first_saver", columns="kind", values="bytes", aggfunc="sum", fill_value=0)
        .reindex(index=graph.names, columns=list(MAP_KINDS), fill_value=0))
    return calls.to_numpy(np.float64), by_kind.to_numpy(np.float64)


def compression_ratios(strategy, half: np.ndarray | None = None,
                       ratio_of: Callable[..., float] | None = None) -> np.ndarray:
    """Compression ratio per unit and map kind (``(units, len(MAP_KINDS))``; 1 where the
    policy's mechanism is not ``compressed``): what the unit's compress policy packs a saved
    record of that kind into (1 for the kinds no compressor packs, ``UNCOMPRESSED``). ``half`` marks units whose saved maps are 16-bit (default:
    none); ``ratio_of(eb, dtype, kind)`` defaults to the GPU step's (:func:`compress_model`)."""
    from ..graph.mapkind import MAP_KINDS, UNCOMPRESSED
    ratio = np.ones((len(strategy), len(MAP_KINDS)))
    comp = np.flatnonzero(POLICIES.mechanism_codes[strategy.policy] == M_COMPRESSED)
    if len(comp) and ratio_of is None:
        ratio_of = compress_model()[0]
    for i in comp:
        dtype = "float16" if half is not None and half[i] else "float32"
        for k, kind in enumerate(MAP_KINDS):
            if kind not in UNCOMPRESSED:      # integers and masks: export keeps them as they are
                ratio[i, k] = max(1.0, float(ratio_of(float(strategy.error_bound[i]), dtype,
                                                      kind)))
    return ratio


CPU_FIGURES = ("backward_flops", "small_flops", "small_backward_flops", "small_op_flops",
               "large_op_flops", "elementwise_bandwidth", "op_overhead", "backward_op_overhead",
               "optimizer_overhead", "offload_bandwidth", "hook_overhead")
"""The device columns of a CPU measured here (:func:`memflow.hardware.local.local_cluster`)
that its time model reads; a cluster without them (the catalogue's) keeps the roofline."""


def cpu_figures(cluster) -> dict[str, float] | None:
    """The CPU step figures of ``cluster`` (the slowest device's), or None where its devices
    are not CPUs measured here.

    >>> import memflow
    >>> cpu_figures(memflow.Cluster.preset("1xV100-16GB")) is None
    True
    """
    devices = getattr(cluster, "devices", None)
    if devices is None or not set(CPU_FIGURES) <= set(devices.columns):
        return None
    col = devices[list(CPU_FIGURES)].astype(float)
    if col.isna().any().any():
        return None
    clock = str(devices["clock"].iloc[0]) if "clock" in devices.columns else "wall"
    # the measured figures at the efficiency table's rows for them (1: taken at face value)
    out = {k: float(col[k].max() if k.endswith(("overhead", "op_flops")) else col[k].min())
           for k in CPU_FIGURES}
    for k in CPU_FIGURES[:3] + CPU_FIGURES[5:]:
        eff = efficiency("cpu", k)
        out[k] = out[k] / eff if k.endswith("overhead") else out[k] * eff
    # the part of a gloo all-reduce that runs beside the compute (local_cluster: 1 where a
    # core is left for gloo's thread, 0 where the processes fill this session's cores)
    overlap = (float(devices["collective_overlap"].astype(float).min())
               if "collective_overlap" in devices.columns else 1.0)
    return out | {"clock": clock, "kernel_rates": _kernel_rates(devices),
                  "collective_overlap": overlap}


def _kernel_rates(devices) -> list[list] | None:
    """The slowest device's shape-class rate table (:mod:`memflow.hardware.kernels`; its
    lowest forward rates), at the efficiency table's row for it; None where there is none."""
    cells = devices["kernel_rates"].dropna() if "kernel_rates" in devices.columns else ()
    tables = [json.loads(c) for c in cells if isinstance(c, str)]
    if not tables:
        return None
    eff = efficiency("cpu", "kernel_flops")
    slow = min(tables, key=lambda t: sum(row[4] for row in t))
    return [[*row[:4], row[4] * eff, row[5] * eff] for row in slow]


def parameter_tensors(graph) -> np.ndarray:
    """Trainable parameter tensors each unit owns (the optimizer steps and autograd
    accumulates each one separately on a CPU)."""
    p = graph.parameters
    owned = p[p["trainable"].astype(bool) & ~p["is_buffer"].astype(bool)]
    return owned.groupby("owner").size().reindex(graph.names, fill_value=0).to_numpy(np.float64)


def kernel_rate(op_flops: np.ndarray, small: float, large: float,
                cpu: dict[str, float]) -> np.ndarray:
    """FLOP/s of a matrix product or convolution of ``op_flops`` FLOPs on a CPU: log-linear in
    the op's size between the rates measured on a small and a large kernel (``small`` at
    ``cpu["small_op_flops"]``, ``large`` at ``cpu["large_op_flops"]``), held outside.

    >>> cpu = {"small_op_flops": 1e6, "large_op_flops": 1e8}
    >>> kernel_rate(np.array([1e5, 1e7, 1e9]), 10.0, 30.0, cpu).tolist()
    [10.0, 20.0, 30.0]
    """
    lo, hi = np.log(cpu["small_op_flops"]), np.log(cpu["large_op_flops"])
    at = np.clip((np.log(np.maximum(op_flops, 1.0)) - lo) / max(hi - lo, 1e-9), 0.0, 1.0)
    return small + (large - small) * at


def cpu_compute(ga, cpu: dict[str, float], rate: np.ndarray, deg: np.ndarray,
                tensors: np.ndarray, shaped: tuple | None = None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Forward, cheap-forward (selective replay) and backward seconds per unit on a CPU.

    A GPU overlaps a unit's memory traffic with its arithmetic (the roofline's max); a CPU
    core runs one op after the other, so its costs add up: the matrix products' and
    convolutions' FLOPs at the rate measured for kernels of their size (:func:`kernel_rate`;
    backward at its own measured rate; ``rate`` is the large kernels' forward rate), the
    other ops' bytes at the measured bandwidth of memory-bound ops, and a dispatch (forward)
    or autograd node (backward, one more per parameter tensor: its gradient accumulation)
    per op. The backward splits its FLOPs and bytes between the two kinds as the forward does.
    ``shaped`` (:func:`memflow.sim.shapes.shaped_rates`: per replica, the FLOPs of each unit's
    kernels of a known shape class, and their forward and backward rates) charges that share
    of the expensive FLOPs at the shape classes' rates instead.
    """
    cheap_bytes = np.maximum(ga.fwd_bytes_moved - ga.expensive_fwd_bytes_moved, 0.0)
    cheap_ops = np.maximum(ga.fwd_ops - ga.expensive_fwd_ops, 0.0)
    heavy = np.divide(ga.expensive_fwd_flops, ga.fwd_flops, out=np.zeros(ga.n),
                      where=ga.fwd_flops > 0)
    light = np.divide(cheap_bytes, ga.fwd_bytes_moved, out=np.ones(ga.n),
                      where=ga.fwd_bytes_moved > 0)
    # the kernels' size: FLOPs per expensive op, per replica
    size = np.divide(ga.expensive_fwd_flops, ga.expensive_fwd_ops * deg, out=np.zeros(ga.n),
                     where=ga.expensive_fwd_ops > 0)
    forward = kernel_rate(size, cpu["small_flops"], rate, cpu)
    backward = kernel_rate(size, cpu["small_backward_flops"], cpu["backward_flops"], cpu)
    if shaped is not None:            # the shaped share at its rates: harmonic means again
        flops, shaped_fwd, shaped_bwd = shaped
        share = np.clip(np.divide(flops * deg, ga.expensive_fwd_flops, out=np.zeros(ga.n),
                                  where=ga.expensive_fwd_flops > 0), 0.0, 1.0)
        forward = 1.0 / (share / shaped_fwd + (1.0 - share) / forward)
        backward = 1.0 / (share / shaped_bwd + (1.0 - share) / backward)
    bw, op, back_op = cpu["elementwise_bandwidth"], cpu["op_overhead"], cpu["backward_op_overhead"]
    cheap = cheap_bytes / deg / bw + cheap_ops * op
    fwd = cheap + ga.expensive_fwd_flops / deg / forward + ga.expensive_fwd_ops * op
    bwd = (ga.bwd_flops * heavy / deg / backward
           + ga.bwd_bytes_moved * light / deg / bw + (ga.bwd_ops + tensors) * back_op)
    return fwd, cheap, bwd


def saved_tensors(graph) -> np.ndarray:
    """Tensors each unit saves for backward (each passes through a policy's pack hook)."""
    count = graph.tensors["savers"].explode().value_counts()
    return count.reindex(graph.names, fill_value=0).to_numpy(np.float64)


def cpu_hooks(offloaded: np.ndarray, hooked: np.ndarray, saved: np.ndarray,
              cpu: dict[str, float]) -> np.ndarray:
    """Seconds per unit that export's saved-tensor hooks add to a CPU step, on the compute
    thread (a CPU has no copy engine to overlap them): the Python pack and unpack of each
    tensor a unit with hooks (``hooked``: offload, compress, and recompute's checkpoint)
    saves, and the copy of its ``offloaded`` bytes into new host images."""
    return np.where(hooked, saved * cpu["hook_overhead"], 0.0) + offloaded / cpu[
        "offload_bandwidth"]


def cpu_optimizer(layout: np.ndarray, update: np.ndarray, tensors: np.ndarray,
                  mem: np.ndarray, cpu: dict[str, float]) -> np.ndarray:
    """Seconds of the optimizer step per layout on a CPU: its bytes at the copy bandwidth (the
    parameters and states do not stay in cache) and an update per parameter tensor (no
    ``foreach`` kernels on a CPU)."""
    n = len(mem)
    return (np.bincount(layout, weights=update, minlength=n) / mem
            + np.bincount(layout, weights=tensors, minlength=n) * cpu["optimizer_overhead"])
