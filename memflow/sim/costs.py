"""The time model (``docs/data-model.md``, "Time model") per placement, over cluster arrays.

Everything here is computed once per (strategy layout, cluster) and cached by the simulator:
the slowest device's rates of a placement, the channels and bandwidth of its host links, of its
rings, and of the copies between two placements (FlexFlow-style overlap of the producer's and
the consumer's partitions).
"""
from __future__ import annotations

from dataclasses import dataclass
import itertools
from functools import lru_cache
from typing import Callable

import numpy as np

from ..hardware.efficiency import efficiency
from ..memory.jit import njit

__all__ = ["LayoutCost", "layout_cost", "copy_cost", "copy_times", "ring_time", "CPU_ADAM_RATE"]

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


def copy_times(keys: tuple, cp, per_sample: np.ndarray, n_devices: int,
               cost: Callable[[tuple, tuple, bool], tuple[np.ndarray, float, float]],
               memo: dict | None = None):
    """Seconds of each copy ``cp`` (:class:`~memflow.memory.records.Copies`) between the
    placements ``keys`` and of its gradient's way back, with the channels of each as CSR
    (link ``l`` is channel ``2 · n_devices + l``). ``cost(src, dst, per_sample)`` is
    :func:`copy_cost`, asked once per distinct (source, destination, per-sample): a strategy
    has many copies and few distinct ones; ``memo`` keeps those answers per ``keys`` and
    distinct routes (a search's moves give units other layouts among the same few, and
    asking was a Python loop per route). Returns ``(forward, back, forward channels, back
    channels)``."""
    scale = np.array([k[0] * k[2] for k in keys], np.float64)
    whole = cp.bytes * np.where(per_sample, scale[cp.dst_layout], 1.0)
    trip = (cp.src_layout * len(keys) + cp.dst_layout) * 2 + per_sample
    uniq, inv = np.unique(trip, return_inverse=True)
    routes = None if memo is None else memo.get((keys, uniq.tobytes()))
    if routes is None:
        routes = _route_costs(keys, uniq, cost)
        if memo is not None:
            if len(memo) > 4096:        # layouts seen long ago
                memo.clear()
            memo[(keys, uniq.tobytes())] = routes
    out = []
    for per, lat, lens, flat in routes:
        first = np.cumsum(lens) - lens
        n_of = lens[inv]
        ptr = np.zeros(len(inv) + 1, np.int64)
        np.cumsum(n_of, out=ptr[1:])
        at = np.repeat(first[inv] - ptr[:-1], n_of) + np.arange(ptr[-1])
        out.append((np.where(n_of > 0, whole * per[inv] + lat[inv], 0.0),
                    (ptr, 2 * n_devices + flat[at])))
    (fwd, fwd_links), (back, back_links) = out
    return fwd, back, fwd_links, back_links


def _route_costs(keys, uniq: np.ndarray, cost) -> tuple[tuple[np.ndarray, ...], ...]:
    """Per direction (forward, back), the seconds per byte, latency, number of links and the
    links, concatenated, of each distinct route ``uniq`` of :func:`copy_times`."""
    pair, ps = np.divmod(uniq, 2)
    src, dst = np.divmod(pair, len(keys))
    fwd = [cost(keys[a], keys[b], bool(c)) for a, b, c in zip(src.tolist(), dst.tolist(),
                                                               ps.tolist())]
    back = [cost(keys[b], keys[a], bool(c)) for a, b, c in zip(src.tolist(), dst.tolist(),
                                                                ps.tolist())]
    out = []
    for answers in (fwd, back):
        per = np.array([x[1] for x in answers], np.float64)
        lat = np.array([x[2] for x in answers], np.float64)
        lens = np.array([len(x[0]) for x in answers], np.int64)
        flat = (np.concatenate([x[0] for x in answers]).astype(np.int64) if answers
                else np.zeros(0, np.int64))
        for x in (per, lat, lens, flat):
            x.flags.writeable = False
        out.append((per, lat, lens, flat))
    return tuple(out)


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
