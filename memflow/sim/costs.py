"""The time model (``docs/data-model.md``, "Time model") per placement, over cluster arrays.

Everything here is computed once per (strategy layout, cluster) and cached by the simulator:
the slowest device's rates of a placement, the channels and bandwidth of its host links, of its
rings, and of the copies between two placements (FlexFlow-style overlap of the producer's and
the consumer's partitions).
"""
from __future__ import annotations

from dataclasses import dataclass
import itertools
import json
from functools import lru_cache
from typing import Callable

import numpy as np

from ..hardware.efficiency import efficiency
from ..memory.jit import njit
from ..strategy.policies import M_COMPRESSED, POLICIES

__all__ = ["LayoutCost", "layout_cost", "copy_cost", "copy_times", "ring_time", "compress_model",
           "compression_ratios", "step_compressor", "step_ratio", "CPU_ADAM_RATE", "CPU_FIGURES", "cpu_figures", "cpu_compute",
           "cpu_optimizer", "parameter_tensors", "cpu_compressor_rate", "kernel_rate",
           "saved_tensors", "cpu_hooks"]

CPU_ADAM_RATE = efficiency("cpu", "cpu_adam_rate")
"""Parameters per second a host's CPU Adam step updates (ZeRO-Offload). CPU Adam is bound by
host memory traffic: about 30 bytes per parameter (fp32 parameter, gradient and two moments
read; parameter and moments written; the bf16 copy written), so ~1e9 parameters/s is ~30 GB/s
of sustained DRAM traffic, a two-socket server's reach with AVX kernels. An assumption, not a
measurement here: a row of ``memflow.hardware.efficiency.EFFICIENCY``."""
OPTIMIZER_LAUNCHES = 10  # foreach kernels per step


@dataclass(frozen=True)
class LayoutCost:
    """Rates of one placement (the slowest of its devices) and its communication channels."""

    devices: np.ndarray          # device positions, part order
    flops32: float
    flops16: float
    flops_bf16: float            # flops16, or flops32 where a device lacks bf16 units
    mem_rate: float
    launch: float
    d2h: tuple[np.ndarray, float, float]     # (link channels, bytes->s factor, latency)
    h2d: tuple[np.ndarray, float, float]
    param_ring: tuple[float, float, int]     # (bandwidth, latency, members)
    replica_ring: tuple[float, float, int]


@lru_cache(maxsize=None)
def _parts(degrees: tuple[int, int, int]) -> np.ndarray:
    """(k, 3) sample, attribute, parameter index of each part (parameter innermost)."""
    s, p, a = degrees
    si, ai, pi = np.meshgrid(np.arange(s), np.arange(a), np.arange(p), indexing="ij")
    return np.stack([si.ravel(), ai.ravel(), pi.ravel()], 1)


Route = Callable[[int, int], list[int]]


def _ring(ca, groups: list[np.ndarray], route: Route) -> tuple[float, float, int]:
    """Bandwidth, latency and size of rings run at once over ``groups`` (device positions)."""
    size = len(groups[0]) if groups else 1
    if size < 2:
        return float("inf"), 0.0, size
    flat, lens = _paths(route, np.concatenate(groups).tolist(),
                        np.concatenate([np.roll(g, -1) for g in groups]).tolist())
    use = np.bincount(flat)          # hops of the rings crossing each link at once
    used = np.flatnonzero(use)
    return float(np.min(ca.link_rate[used] / use[used])), _slowest(ca, flat, lens), size


def _host_links(ca, devs: np.ndarray, up: bool, route: Route) -> tuple[np.ndarray, float, float]:
    hosts = (len(ca.devices) + ca.host[devs]).tolist()
    flat, lens = _paths(route, *((devs.tolist(), hosts) if up else (hosts, devs.tolist())))
    return (np.unique(flat), float(np.max(1.0 / ca.link_rate[flat], initial=0.0)),
            _slowest(ca, flat, lens))


def layout_cost(ca, key: tuple, route: Route | None = None) -> LayoutCost:
    """The cost figures of placement ``key`` = ``(sample, parameter, attribute, devices)``;
    ``route(a, b)`` (default: the cluster's) gives the link ids between two vertices."""
    route = route or ca.routing.route
    s, p, a, names = key
    devs = ca.devices.get_indexer(list(names)).astype(np.int64)
    f32 = ca.flops_fp32[devs] * ca.compute_efficiency[devs]
    f16 = np.where(np.isnan(ca.flops_fp16[devs]), ca.flops_fp32[devs],
                   ca.flops_fp16[devs]) * ca.compute_efficiency[devs]
    bf16 = np.where(ca.bf16[devs], f16, f32)
    mem = ca.mem_bandwidth[devs] * ca.memory_efficiency[devs]
    parts = _parts((s, p, a))
    by_param = [devs[parts[:, 2] == i] for i in range(p)]
    by_region = [devs[(parts[:, 0] == i) & (parts[:, 1] == j)] for i in range(s) for j in range(a)]
    return LayoutCost(devices=devs, flops32=float(f32.min()), flops16=float(f16.min()),
                      flops_bf16=float(bf16.min()),
                      mem_rate=float(mem.min()), launch=float(ca.launch_overhead[devs].max()),
                      d2h=_host_links(ca, devs, True, route),
                      h2d=_host_links(ca, devs, False, route),
                      param_ring=_ring(ca, by_region, route),
                      replica_ring=_ring(ca, by_param, route))


def ring_time(nbytes, bandwidth, latency, members):
    """Ring all-reduce time ``2(n−1)/n · S/B + 2(n−1)·latency`` (0 for fewer than 2
    members); works on numbers and on numpy arrays.

    >>> float(ring_time(1e9, 1e10, 1e-5, 4))
    0.15006
    """
    n = np.maximum(members, 1)
    return np.where(members > 1, 2 * (n - 1) / n * nbytes / bandwidth + 2 * (n - 1) * latency,
                    0.0)


def copy_cost(ca, src: tuple, dst: tuple, per_sample: bool, route: Route | None = None,
              positions: tuple[np.ndarray, np.ndarray] | None = None
              ) -> tuple[np.ndarray, float, float]:
    """Channels, seconds per byte of the whole tensor, and latency of copying a tensor from
    placement ``src`` to placement ``dst`` (both ``(s, p, a, devices)``).

    Each destination part needs its sample × attribute region (the whole tensor when it does
    not scale with the batch: then from the producer part of the same sample and attribute
    index, modulo); it takes each overlapping piece from the producer part with the same
    parameter rank (modulo), or from its own device when that already holds the region.
    ``route(a, b)`` (default: the cluster's) gives the link ids between two device positions;
    ``positions`` the device positions of ``src`` and ``dst`` where the caller has them.

    >>> import memflow
    >>> ca = memflow.Cluster.preset("4xV100-16GB").arrays
    >>> links, per_byte, lat = copy_cost(ca, (1, 1, 1, ("gpu0",)), (2, 1, 1, ("gpu0", "gpu1")),
    ...                                  True)
    >>> len(links), per_byte > 0
    (2, True)
    """
    route = route or ca.routing.route
    s1, p1, a1, n1 = src
    s2, p2, a2, n2 = dst
    d1, d2 = positions if positions is not None else (ca.devices.get_indexer(list(n1)),
                                                      ca.devices.get_indexer(list(n2)))
    src_dev, dst_dev, share = _transfers(s1, p1, a1, np.asarray(d1, np.int64), s2, p2, a2,
                                         np.asarray(d2, np.int64), bool(per_sample),
                                         len(ca.devices))
    flat, lens = _paths(route, src_dev.tolist(), dst_dev.tolist())
    if not len(flat):
        return np.zeros(0, np.int64), 0.0, 0.0
    # each link's share of the tensor, summed in the pairs' order (as a loop over them would)
    load = np.bincount(flat, weights=np.repeat(share, lens))
    uniq, first = np.unique(flat, return_index=True)
    links = uniq[np.argsort(first)]          # by first use
    per_byte = float(np.max(load[uniq] / ca.link_rate[uniq]))
    return links, per_byte, _slowest(ca, flat, lens)


@njit
def _transfers(s1, p1, a1, d1, s2, p2, a2, d2, per_sample, n_devices):
    """What a copy from parts ``(s1, p1, a1)`` on devices ``d1`` to parts ``(s2, p2, a2)`` on
    ``d2`` moves (:func:`copy_cost`'s rules): per (destination part, producer part) pair that
    moves anything, destination-major, the producer's device, the destination's and the
    share of the tensor. One compiled pass: as broadcast expressions over the parts (the same
    operations on the same numbers, so the same bits) these were most of a new copy's cost.
    Part ``k`` of ``(s, p, a)`` is sample ``k // (p a)``, attribute ``k // p % a``,
    parameter ``k % p`` (:func:`_parts`)."""
    n1, n2 = s1 * p1 * a1, s2 * p2 * a2
    # a destination device that holds a producer part of the same region takes nothing
    held = np.zeros((s1 * a1, n_devices), np.bool_)
    for k1 in range(n1):
        held[k1 // p1, d1[k1]] = True
    src = np.empty(n1 * n2, np.int64)
    dst = np.empty(n1 * n2, np.int64)
    share = np.empty(n1 * n2)
    m = 0
    for k2 in range(n2):
        si, ai, pi = k2 // (p2 * a2), k2 // p2 % a2, k2 % p2
        for k1 in range(n1):
            sj, aj, pj = k1 // (p1 * a1), k1 // p1 % a1, k1 % p1
            if pj != pi % p1 or held[k1 // p1, d2[k2]]:
                continue
            if per_sample:      # the overlap of the two parts' sample × attribute regions
                ov = (max(0.0, min((si + 1) / s2, (sj + 1) / s1) - max(si / s2, sj / s1))
                      * max(0.0, min((ai + 1) / a2, (aj + 1) / a1) - max(ai / a2, aj / a1)))
            else:   # replicated: from the producer part of the same replica
                ov = 1.0 if sj == si % s1 and aj == ai % a1 else 0.0
            if ov > 0:
                src[m], dst[m], share[m] = d1[k1], d2[k2], ov
                m += 1
    return src[:m], dst[:m], share[:m]


def _paths(route: Route, src: list[int], dst: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """The links of the routes ``src[k] -> dst[k]``, concatenated, and each route's length:
    a copy or a ring has tens to hundreds of them (one numpy pass, not one per route)."""
    paths = [route(a, b) for a, b in zip(src, dst)]
    lens = np.fromiter(map(len, paths), np.int64, len(paths))
    return np.fromiter(itertools.chain.from_iterable(paths), np.int64, int(lens.sum())), lens


def _slowest(ca, flat: np.ndarray, lens: np.ndarray) -> float:
    """The largest latency of the routes ``flat`` (:func:`_paths`), each summed along its
    links in order; 0 for none."""
    if not len(flat):
        return 0.0
    lat = ca.link_latency[flat]
    # a route's links summed one after another, as np.sum adds fewer than eight
    starts = np.cumsum(lens) - lens
    some = lens > 0
    return float(np.max(np.add.reduceat(lat, starts[some]), initial=0.0))


def copy_times(keys: list[tuple], cp, per_sample: np.ndarray, n_devices: int,
               cost: Callable[[tuple, tuple, bool], tuple[np.ndarray, float, float]]):
    """Seconds of each copy ``cp`` (:class:`~memflow.memory.records.Copies`) between the
    placements ``keys`` and of its gradient's way back, with the channels of each as CSR
    (link ``l`` is channel ``2 · n_devices + l``). ``cost(src, dst, per_sample)`` is
    :func:`copy_cost`, asked once per distinct (source, destination, per-sample): a strategy
    has many copies and few distinct ones. Returns ``(forward, back, forward channels, back
    channels)``."""
    scale = np.array([k[0] * k[2] for k in keys], np.float64)
    whole = cp.bytes * np.where(per_sample, scale[cp.dst_layout], 1.0)
    trip = (cp.src_layout * len(keys) + cp.dst_layout) * 2 + per_sample
    uniq, inv = np.unique(trip, return_inverse=True)
    pair, ps = np.divmod(uniq, 2)
    src, dst = np.divmod(pair, len(keys))
    out = []
    for forward in (True, False):
        per, lat = np.empty(len(uniq)), np.empty(len(uniq))
        links = []
        for j in range(len(uniq)):
            a, b = keys[int(src[j])], keys[int(dst[j])]
            lk, per[j], lat[j] = cost(a, b, bool(ps[j])) if forward else cost(b, a, bool(ps[j]))
            links.append(lk)
        lens = np.array([len(x) for x in links], np.int64)
        flat = (np.concatenate(links).astype(np.int64) if links else np.zeros(0, np.int64))
        first = np.cumsum(lens) - lens
        n_of = lens[inv]
        ptr = np.zeros(len(inv) + 1, np.int64)
        np.cumsum(n_of, out=ptr[1:])
        at = np.repeat(first[inv] - ptr[:-1], n_of) + np.arange(ptr[-1])
        out.append((np.where(n_of > 0, whole * per[inv] + lat[inv], 0.0),
                    (ptr, 2 * n_devices + flat[at])))
    (fwd, fwd_links), (back, back_links) = out
    return fwd, back, fwd_links, back_links


def tied_allreduce(ga, copies: list[tuple[int, int, int]], layout: np.ndarray, keys: list[tuple],
                   cost: Callable[[tuple, tuple, bool], tuple[np.ndarray, float, float]]
                   ) -> np.ndarray:
    """Seconds per layout of summing the gradients of the weights pipeline stages hold copies
    of (:func:`memflow.memory.states.stage_copies`: ``(owner, holder, weight)``): a two-party
    all-reduce moves the whole gradient each way, as one copy between the stages does; both
    stages wait for it before their optimizer step. ``cost`` is :func:`copy_cost`."""
    out = np.zeros(len(keys))
    for owner, holder, k in copies:
        if ga.param_grad_bytes[k] > 0:
            a, b = int(layout[owner]), int(layout[holder])
            _, per_byte, lat = cost(keys[a], keys[b], False)
            out[[a, b]] += ga.param_grad_bytes[k] / keys[b][1] * per_byte + lat
    return out


def compress_model(clock: str | None = None
                   ) -> tuple[Callable[..., float], Callable[..., float], Callable[..., float]]:
    """``(expected_ratio, throughput, launches)`` of activation compression, from
    :mod:`memflow.compress` (imported on first use: it loads torch). ``expected_ratio(eb,
    dtype, kind)`` is the ratio of the compressor the exported step runs: the quantizer on
    a GPU; on a CPU measured here (``clock``: the cluster's, see :func:`cpu_figures`)
    :func:`memflow.compress.choose`'s (SZ3 where pysz is installed), whose throughput is then
    its own, measured (:func:`cpu_compressor_rate`; its calls' overhead inside it), not the
    GPU quantizer's memory traffic."""
    from ..compress.model import launches, throughput
    if clock is None:
        return step_ratio(False), throughput, launches

    def measured(_mem_rate: float, *, decompress: bool = False,
                 error_bound: float = 1e-2) -> float:
        return cpu_compressor_rate(error_bound, decompress, clock) * efficiency("cpu",
                                                                                "compress_rate")
    return step_ratio(True), measured, lambda bits, decompress=False: 0.0


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


@lru_cache(maxsize=None)
def cpu_compressor_rate(error_bound: float, decompress: bool, clock: str = "cpu") -> float:
    """Bytes per second that export's compressor (:func:`memflow.compress.compress`: SZ3
    where pysz is installed) packs, or unpacks, of a ReLU feature map (1 MiB, fp32) on one
    thread of this machine, timed by ``clock`` ("cpu": the process's CPU time; "wall").
    Measured once per process, in a fraction of a second.

    >>> cpu_compressor_rate(1e-2, False) > 0
    True
    """
    import time

    import torch

    from ..compress import compress, decompress as unpack
    clock_of = time.process_time if clock == "cpu" else time.perf_counter
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        x = torch.randn(8, 32, 32, 32, generator=torch.Generator().manual_seed(0)).relu_()
        packed = compress(x, error_bound)
        run = (lambda: unpack(packed)) if decompress else (lambda: compress(x, error_bound))
        run()
        calls, t0 = 0, clock_of()
        while calls < 3 or clock_of() - t0 < 0.2:
            run()
            calls += 1
        return x.numel() * x.element_size() * calls / max(clock_of() - t0, 1e-9)
    finally:
        torch.set_num_threads(before)


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
    return out | {"clock": clock, "kernel_rates": _kernel_rates(devices)}


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
