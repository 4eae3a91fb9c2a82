"""The time model (``docs/data-model.md``, "Time model") per placement, over cluster arrays.

Everything here is computed once per (strategy layout, cluster) and cached by the simulator:
the slowest device's rates of a placement, the channels and bandwidth of its host links, of its
rings, and of the copies between two placements (FlexFlow-style overlap of the producer's and
the consumer's partitions).
"""
from __future__ import annotations

from dataclasses import dataclass
import itertools
import weakref
from functools import lru_cache
from typing import Callable

import numpy as np

from ..hardware.efficiency import efficiency
from ..memory.jit import njit

__all__ = ["LayoutCost", "layout_cost", "copy_cost", "CopyRoutes", "copy_times", "ring_time",
           "pairwise_sum", "CPU_ADAM_RATE"]

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

# per cluster arrays: each device's position by name (pandas' get_indexer made an Index of
# the names for every new layout: a third of a new layout's cost on 64 GPUs)
_POSITIONS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _device_positions(ca, names) -> np.ndarray:
    """Positions of the devices ``names`` in ``ca`` (int64; -1 for a name not there, as
    pandas' ``get_indexer`` gives)."""
    at = _POSITIONS.get(ca)
    if at is None:
        at = _POSITIONS[ca] = {name: i for i, name in enumerate(ca.devices)}
    return np.array([at.get(name, -1) for name in names], np.int64)


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
    devs = _device_positions(ca, names)
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
    d1, d2 = positions if positions is not None else (_device_positions(ca, n1),
                                                      _device_positions(ca, n2))
    src_dev, dst_dev, share = _transfers(s1, p1, a1, np.asarray(d1, np.int64), s2, p2, a2,
                                         np.asarray(d2, np.int64), bool(per_sample),
                                         len(ca.devices))
    flat, lens = _paths(route, src_dev.tolist(), dst_dev.tolist())
    links, per_byte, latency = _loads(flat, lens, share, ca.link_rate, ca.link_latency)
    return links, float(per_byte), float(latency)


@njit
def _loads(flat, lens, share, link_rate, link_latency):
    """The links the routes ``flat`` (:func:`_paths`) cross, by first use, the largest of their
    loads (each route carrying its ``share``) over their rates, and the slowest route's latency
    (:func:`_slowest_route`): one compiled pass over a copy's routes. A link's load is summed
    in the routes' order from 0, as ``np.bincount`` with weights adds; no routes: no links, 0."""
    load = np.zeros(len(link_rate))
    seen = np.zeros(len(link_rate), np.bool_)
    links = np.empty(len(flat), np.int64)
    m = j = 0
    for r in range(len(lens)):
        for _ in range(lens[r]):
            link = flat[j]
            load[link] += share[r]
            if not seen[link]:
                seen[link] = True
                links[m] = link
                m += 1
            j += 1
    per_byte = 0.0
    for k in range(m):
        per_byte = max(per_byte, load[links[k]] / link_rate[links[k]])
    return links[:m], per_byte, _slowest_route(link_latency, flat, lens)


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
    links (:func:`_route_latency`); 0 for none."""
    return float(_slowest_route(ca.link_latency, flat, lens))


@njit
def _slowest_route(link_latency, flat, lens):
    slowest = 0.0
    j = 0
    for r in range(len(lens)):
        if lens[r] > 0:
            slowest = max(slowest, _route_latency(link_latency, flat, j, lens[r]))
        j += lens[r]
    return slowest


@njit
def _route_latency(link_latency, flat, start, n):
    """The latencies of the links ``flat[start:start + n]`` (n > 0) summed as numpy's
    ``add.reduceat`` sums a segment, which the routes' latencies were: its first term plus
    numpy's pairwise sum of the rest from -0.0 (for n > 3 not a left-to-right sum, and not
    what ``np.sum`` gives either)."""
    first = link_latency[flat[start]]
    return first + pairwise_sum(link_latency[flat[start + 1:start + n]], -0.0)


@njit
def pairwise_sum(a, start):
    """The float64 array ``a`` summed as numpy's pairwise summation does, from ``start``:
    one by one under 8 terms; else 8 running sums over blocks of 8, combined as a tree, then
    the remainder, for up to 128 terms; halves (a multiple of 8 first) beyond, each from
    ``start``. ``np.sum`` is this from 0.0, a segment of ``np.add.reduceat`` its first term
    plus this of the rest from -0.0: the same bits.

    >>> a = np.linspace(0.1, 3.0, 300)
    >>> float(pairwise_sum(a, 0.0)) == float(np.sum(a))
    True
    """
    n = len(a)
    if n < 8:
        res = start
        for i in range(n):
            res += a[i]
        return res
    if n > 128:
        half = n // 2
        half -= half % 8
        return pairwise_sum(a[:half], start) + pairwise_sum(a[half:], start)
    r = a[:8].copy()
    i = 8
    while i < n - n % 8:
        for k in range(8):
            r[k] += a[i + k]
        i += 8
    res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
    while i < n:
        res += a[i]
        i += 1
    return res


class CopyRoutes:
    """The copy routes a simulator has met, each asked once: per route (source layout,
    destination layout, whether the tensor scales with the batch) the seconds per byte of
    the whole tensor, the latency and the links of :func:`copy_cost`, numbered in the order
    met and held in flat arrays, so that :func:`copy_times` reads a strategy's copies off
    them in one compiled pass (a search's moves give units other layouts, and each new list
    of layouts had asked every route again, one Python call and one array per route).

    A route is known by its code, ``((source << 31) + destination) · 2 + per-sample`` over
    the layouts' numbers (:class:`~memflow.sim.layouts.LayoutTable`); the codes met are kept
    ascending with their routes' numbers, so that the compiled pass finds them by bisection.
    ``cost(src, dst, per_sample)`` is :func:`copy_cost` (the simulator's, cached)."""

    def __init__(self, cost: Callable[[tuple, tuple, bool], tuple[np.ndarray, float, float]]):
        self._cost = cost
        self.codes = np.zeros(0, np.int64)       # the codes met, ascending
        self.index = np.zeros(0, np.int64)       # the number of each one's route
        self.per_byte, self.latency = np.empty(64), np.empty(64)
        self.ptr = np.zeros(65, np.int64)        # CSR over the routes: their links
        self.links = np.empty(1024, np.int64)
        self.n = 0

    def number(self, code: int, src: tuple, dst: tuple, per_sample: bool) -> int:
        """The number of the route ``code`` from layout ``src`` to ``dst`` (costed and
        added when new)."""
        at = int(np.searchsorted(self.codes, code))
        if at < len(self.codes) and self.codes[at] == code:
            return int(self.index[at])
        links, per_byte, latency = self._cost(src, dst, per_sample)
        k = self.n
        if k + 1 >= len(self.per_byte):
            self.per_byte, self.latency, self.ptr = (
                np.resize(x, 2 * len(x)) for x in (self.per_byte, self.latency, self.ptr))
        end = self.ptr[k] + len(links)
        if end > len(self.links):
            self.links = np.resize(self.links, 2 * end)
        self.per_byte[k], self.latency[k], self.ptr[k + 1] = per_byte, latency, end
        self.links[self.ptr[k]:end] = links
        self.codes, self.index = np.insert(self.codes, at, code), np.insert(self.index, at, k)
        self.n += 1
        return k


def copy_times(keys: tuple, numbers: np.ndarray, cp, per_sample: np.ndarray,
               scale: np.ndarray, n_devices: int, routes: CopyRoutes,
               head: tuple[np.ndarray, np.ndarray]):
    """Seconds of each copy ``cp`` (:class:`~memflow.memory.records.Copies`) between the
    placements ``keys`` (numbered ``numbers``) and of its gradient's way back, and the
    channel sets as one CSR: ``head``'s rows, then each copy's channels, then each way back's
    (link ``l`` is channel ``2 · n_devices + l``). A copy of tensor ``t`` scales with the
    batch where ``per_sample[t]``: then it moves its bytes times ``scale`` of its
    destination (the layout's sample × attribute parts). ``routes`` (:class:`CopyRoutes`)
    gives each distinct route's cost: a strategy has many copies and few distinct routes.
    Returns ``(forward, back, (ptr, idx))``."""
    while True:
        missing, times, ptr, idx = _copy_pass(
            cp.bytes, cp.src_layout, cp.dst_layout, cp.tensor, per_sample, numbers, scale,
            routes.codes, routes.index, routes.per_byte, routes.latency, routes.ptr,
            routes.links, 2 * n_devices, head[0], head[1])
        if not len(missing):
            return times[0], times[1], (ptr, idx)
        for a, b, ps, code in missing.tolist():        # routes met for the first time
            routes.number(code, keys[a], keys[b], bool(ps))


@njit
def _copy_pass(nbytes, src, dst, tensor, per_sample, ids, scale, codes, index, per_byte,
               latency, ptr, links, offset, head_ptr, head_idx):
    """:func:`copy_times` as one pass: the distinct routes of the copies (:func:`_distinct`),
    their numbers forward and back among the routes met, then the times (:func:`_times`);
    the routes not met yet instead, as rows (source, destination, per-sample, code), when
    there are any."""
    ps = per_sample[tensor]
    inv, a, b, flag, route_codes = _distinct(src, dst, ps, ids)
    m = len(a)
    numbers = np.empty((2, m), np.int64)
    missing = np.empty((2 * m, 4), np.int64)
    n_missing = 0
    for d in range(2):
        for k in range(m):
            code = route_codes[d, k]
            at = np.searchsorted(codes, code)
            if at < len(codes) and codes[at] == code:
                numbers[d, k] = index[at]
            else:
                missing[n_missing, 0] = a[k] if d == 0 else b[k]
                missing[n_missing, 1] = b[k] if d == 0 else a[k]
                missing[n_missing, 2], missing[n_missing, 3] = flag[k], code
                n_missing += 1
    if n_missing:
        return missing[:n_missing], np.empty((2, 0)), head_ptr[:0], head_idx[:0]
    times, out_ptr, idx = _times(nbytes, dst, ps, scale, inv, numbers[0], numbers[1],
                                 per_byte, latency, ptr, links, offset, head_ptr, head_idx)
    return missing[:0], times, out_ptr, idx


@njit
def _distinct(src, dst, per_sample, ids):
    """The distinct routes (source, destination, per-sample) of the copies between layouts
    numbered ``ids``, by first use: each copy's among them, their source, destination and
    per-sample flag, and the codes of each forward and back (:class:`CopyRoutes`)."""
    n_layouts = len(ids)
    slot = np.full(2 * n_layouts * n_layouts, -1, np.int64)
    inv = np.empty(len(src), np.int64)
    a = np.empty(len(src), np.int64)
    b = np.empty(len(src), np.int64)
    ps = np.empty(len(src), np.int64)
    m = 0
    for i in range(len(src)):
        flag = 1 if per_sample[i] else 0
        t = (src[i] * n_layouts + dst[i]) * 2 + flag
        if slot[t] < 0:
            slot[t] = m
            a[m], b[m], ps[m] = src[i], dst[i], flag
            m += 1
        inv[i] = slot[t]
    codes = np.empty((2, m), np.int64)
    for k in range(m):
        codes[0, k] = ((ids[a[k]] << 31) + ids[b[k]]) * 2 + ps[k]
        codes[1, k] = ((ids[b[k]] << 31) + ids[a[k]]) * 2 + ps[k]
    return inv, a[:m], b[:m], ps[:m], codes


@njit
def _times(nbytes, dst, per_sample, scale, inv, fwd, back, per_byte, latency, ptr, links,
           offset, head_ptr, head_idx):
    """The times of :func:`copy_times`: a copy of a tensor that scales with the batch moves
    its bytes times the destination's sample × attribute degree; a route without links
    takes no time."""
    n, h = len(inv), len(head_ptr) - 1
    out = np.empty((2, n))
    out_ptr = np.empty(h + 2 * n + 1, np.int64)
    out_ptr[:h + 1] = head_ptr
    for d in range(2):
        route = fwd if d == 0 else back
        for i in range(n):
            k = route[inv[i]]
            length = ptr[k + 1] - ptr[k]
            whole = nbytes[i] * (scale[dst[i]] if per_sample[i] else 1.0)
            out[d, i] = whole * per_byte[k] + latency[k] if length > 0 else 0.0
            out_ptr[h + d * n + i + 1] = out_ptr[h + d * n + i] + length
    idx = np.empty(out_ptr[-1], np.int64)
    idx[:len(head_idx)] = head_idx
    j = len(head_idx)
    for d in range(2):
        route = fwd if d == 0 else back
        for i in range(n):
            k = route[inv[i]]
            for m in range(ptr[k], ptr[k + 1]):
                idx[j] = offset + links[m]
                j += 1
    return out, out_ptr, idx


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
