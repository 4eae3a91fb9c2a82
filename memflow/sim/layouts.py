"""The layouts a simulator has met, numbered, and what a list of them fixes.

A layout is one placement ``(sample, parameter, attribute, devices)``. Each one met gets a
number, its cost figures (:func:`~memflow.sim.costs.layout_cost`), its row of rates and its
channels (devices, links to and from their hosts) in flat tables, so that a strategy's list
of layouts is read off the tables in one compiled pass (:meth:`LayoutTable.of`): a search
re-places a strategy for every configuration move, and each new list of layouts had been
gathered in ~20 numpy calls.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..memory.jit import njit
from .costs import LayoutCost
from .folding import classes
from .run import OfLayouts

__all__ = ["LayoutTable", "RATE_COLUMNS", "DEGREE", "FLOPS32", "FLOPS16", "MEM", "LAUNCH",
           "PARAM_RING", "REPLICA_RING", "D2H", "H2D", "FLOPS_BF16", "REGION"]

RATE_COLUMNS = 17
"""Columns of a layout's row of rates (:attr:`LayoutTable.rates`)."""
DEGREE, FLOPS32, FLOPS16, MEM, LAUNCH, PARAM_RING, REPLICA_RING, D2H, H2D, FLOPS_BF16, \
    REGION = 0, 1, 2, 3, 4, 5, 8, 11, 13, 15, 16
"""Where a row holds the layout's devices (``s · p · a``), its slowest device's flop rates
(fp32, 16-bit), memory rate and kernel launch, its rings' (bandwidth, latency, members)
over the parameter shards and over the replicas, its links' seconds per byte and latency to
its hosts and from them, the bfloat16 flop rate and its sample × attribute parts
(``s · a``: what a copy of a tensor that scales with the batch multiplies its bytes by)."""


class LayoutTable:
    """The layouts met, numbered in the order met; ``cost(key)`` is
    :func:`~memflow.sim.costs.layout_cost` of layout ``key``.

    >>> import memflow
    >>> from memflow.sim.costs import layout_cost
    >>> ca = memflow.Cluster.preset("4xV100-16GB").arrays
    >>> table = LayoutTable(lambda key: layout_cost(ca, key))
    >>> keys = ((2, 1, 1, ("gpu0", "gpu1")), (1, 1, 1, ("gpu2",)))
    >>> table.numbers(keys).tolist(), table.numbers(keys[::-1]).tolist()
    ([0, 1], [1, 0])
    >>> of = table.of(table.numbers(keys), ca.host, 4)
    >>> of.devices_used.tolist(), of.rates[:, DEGREE].tolist(), of.n_device_classes
    ([0, 1, 2], [2.0, 1.0], 3)
    """

    def __init__(self, cost: Callable[[tuple], LayoutCost]):
        self._cost = cost
        self._number: dict[tuple, int] = {}
        self.lcs: list[LayoutCost] = []          # per layout number
        self.rates = np.empty((16, RATE_COLUMNS))
        # CSR, three rows per layout: its devices, the links to its hosts, those from them
        self.ptr = np.zeros(3 * 16 + 1, np.int64)
        self.idx = np.empty(256, np.int64)

    def numbers(self, keys) -> np.ndarray:
        """The number of each layout of ``keys`` (a new one costed and added)."""
        got = list(map(self._number.get, keys))
        if None in got:
            got = [self._add(key) if k is None else k for key, k in zip(keys, got)]
        return np.array(got, np.int64)

    def number(self, key: tuple) -> int:
        """The number of layout ``key`` (costed and added when new)."""
        k = self._number.get(key)
        return self._add(key) if k is None else k

    def _add(self, key: tuple) -> int:
        k = self._number.get(key)        # met before in the same list
        if k is not None:
            return k
        lc = self._cost(key)
        k = self._number[key] = len(self.lcs)
        self.lcs.append(lc)
        if k == len(self.rates):
            self.rates = np.resize(self.rates, (2 * k, RATE_COLUMNS))
            self.ptr = np.resize(self.ptr, 6 * k + 1)
        s, p, a = key[:3]
        self.rates[k] = (s * p * a, lc.flops32, lc.flops16, lc.mem_rate, lc.launch,
                         *lc.param_ring, *lc.replica_ring, *lc.d2h[1:], *lc.h2d[1:],
                         lc.flops_bf16, s * a)
        at = self.ptr[3 * k]
        for j, row in enumerate((lc.devices, lc.d2h[0], lc.h2d[0])):
            end = at + len(row)
            if end > len(self.idx):
                self.idx = np.resize(self.idx, 2 * end)
            self.idx[at:end] = row
            self.ptr[3 * k + j + 1] = at = end
        return k

    def of(self, numbers: np.ndarray, host: np.ndarray, n_devices: int,
           fold: bool = True) -> OfLayouts:
        """What the list of layouts numbered ``numbers`` fixes whichever units take them:
        their rates, their channel sets (compute, then communication, to-host and from-host
        per layout: device ``d`` is channel ``d``, its communication ``n_devices + d``, link
        ``l`` channel ``2 · n_devices + l``), the device classes (:func:`classes`) and each
        layout's hosts; ``host`` is each device's host."""
        dev_ptr, devs, ch_ptr, ch_idx, hosts, used, rates = _gather(
            numbers, self.ptr, self.idx, self.rates, host, n_devices)
        dev_cls, (cls_ptr, cls) = classes(dev_ptr, devs, n_devices, fold)
        return OfLayouts(numbers=numbers, lcs=[self.lcs[k] for k in numbers.tolist()],
                         rates=rates,
                         channels=(ch_ptr, ch_idx), device_class=dev_cls,
                         layout_classes=_rows(cls_ptr, cls), layout_hosts=_rows(dev_ptr, hosts),
                         devices_used=used, mem_rate=rates[:, MEM], launch=rates[:, LAUNCH],
                         n_device_classes=int(dev_cls.max()) + 1)


@njit
def _gather(numbers, ptr, idx, table, host, n_devices):
    """:meth:`LayoutTable.of`'s rows for the layouts ``numbers``: their devices (CSR), the
    channel sets, the devices' hosts, the devices used (ascending) and the rows of rates."""
    K = len(numbers)
    sizes = np.zeros((3, K + 1), np.int64)     # devices, to-host links, from-host links
    for i in range(K):
        for j in range(3):
            row = 3 * numbers[i] + j
            sizes[j, i + 1] = sizes[j, i] + ptr[row + 1] - ptr[row]
    D, T, F = sizes[0, K], sizes[1, K], sizes[2, K]
    ch_ptr = np.empty(4 * K + 1, np.int64)
    ch_idx = np.empty(2 * D + T + F, np.int64)
    ch_ptr[0] = 0
    # per set kind (compute, communication, to-host, from-host): its first set, its first
    # channel, the row of each layout it reads and the channel number of that row's items
    first_set = (0, K, 2 * K, 3 * K)
    start = (0, D, 2 * D, 2 * D + T)
    rows = (0, 0, 1, 2)
    offset = (0, n_devices, 2 * n_devices, 2 * n_devices)
    for kind in range(4):
        j = rows[kind]
        for i in range(K):
            row = 3 * numbers[i] + j
            at = start[kind] + sizes[j, i]
            for m in range(ptr[row], ptr[row + 1]):
                ch_idx[at] = offset[kind] + idx[m]
                at += 1
            ch_ptr[first_set[kind] + i + 1] = start[kind] + sizes[j, i + 1]
    devs = ch_idx[:D].copy()
    busy = np.zeros(n_devices, np.bool_)
    for d in range(D):
        busy[devs[d]] = True
    rates = np.empty((K, table.shape[1]))
    for i in range(K):
        rates[i] = table[numbers[i]]
    return sizes[0].copy(), devs, ch_ptr, ch_idx, host[devs], np.flatnonzero(busy), rates


def _rows(ptr: np.ndarray, idx: np.ndarray) -> list[np.ndarray]:
    """CSR rows as a list of arrays (views of ``idx``)."""
    bounds = ptr.tolist()
    return [idx[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
