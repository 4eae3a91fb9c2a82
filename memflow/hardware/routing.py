"""Routes between devices: which links a transfer crosses, its bottleneck bandwidth and latency.

The network is a directed graph whose vertices are devices, hosts and switches and whose edges
are the link rows. Devices do not forward traffic: a route leaves its source device by one
*uplink* (to a host or switch), crosses hosts and switches (*hubs*), and enters the destination
by one *downlink*, or uses a direct device-to-device link. Among all such routes memflow takes
the one that moves 1 MiB fastest hop by hop (``latency + 1 MiB / (bandwidth · efficiency)``
summed over links), which prefers NVLink to PCIe and few hops to many.

Only the hubs (a few hundred even for 1,024 GPUs: one host and one NVSwitch per node, one
network switch) get all-pairs shortest paths (scipy's Dijkstra). A device pair then picks the
best of (its uplinks × the destination's downlinks), so the dense tables for every device pair
are a few vectorized gathers.

>>> import numpy as np, pandas as pd
>>> links = pd.DataFrame({"src": ["gpu0", "host0", "gpu1", "host0"],
...                       "dst": ["host0", "gpu1", "host0", "gpu0"],
...                       "rate": 1e10, "latency": 1e-6})
>>> r = Routing(pd.Index(["gpu0", "gpu1"]), pd.Index(["host0"]), links)
>>> r.route(0, 1)
[0, 1]
>>> float(r.bandwidth[0, 1]), float(r.latency[0, 1])
(10000000000.0, 2e-06)
"""
from __future__ import annotations

from functools import cached_property
from typing import Iterator

import numpy as np
import pandas as pd
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import dijkstra

from ..errors import ClusterError

__all__ = ["Routing", "REFERENCE_BYTES"]

REFERENCE_BYTES = 2 ** 20
"""Message size whose hop-by-hop time ranks candidate routes."""



class Routing:
    """Route lookups over validated link rows.

    ``links`` needs ``src``, ``dst`` (vertex names), ``rate`` (achieved bytes/s, that is
    bandwidth · efficiency) and ``latency``. ``devices`` are the endpoints that never forward;
    ``hubs`` are hosts and switches. Scalar lookups (:meth:`route`) are cheap for any size;
    the dense tables (:attr:`routes`, :attr:`bandwidth`, :attr:`latency`) are built on first
    use and cost O(devices²) memory: about 40 MB for 1,024 devices.
    """

    def __init__(self, devices: pd.Index, hubs: pd.Index, links: pd.DataFrame) -> None:
        self.n = len(devices)
        names = devices.append(hubs)
        self.vertex = pd.Index(names)
        src = self.vertex.get_indexer(links["src"])
        dst = self.vertex.get_indexer(links["dst"])
        self.rate = links["rate"].to_numpy(np.float64)
        self.link_latency = links["latency"].to_numpy(np.float64)
        weight = self.link_latency + REFERENCE_BYTES / self.rate
        self._build_hub_paths(src, dst, weight)
        self._build_attachments(src, dst, weight)

    # -- construction -----------------------------------------------------------------------
    def _build_hub_paths(self, src: np.ndarray, dst: np.ndarray, weight: np.ndarray) -> None:
        n, m = self.n, len(self.vertex) - self.n
        hub = (src >= n) & (dst >= n)
        hs, hd, hw, hl = src[hub] - n, dst[hub] - n, weight[hub], np.flatnonzero(hub)
        # parallel links between two hubs: keep the fastest (csr_matrix would add them up)
        order = np.lexsort((hw, hd, hs))
        hs, hd, hw, hl = hs[order], hd[order], hw[order], hl[order]
        first = np.ones(len(hs), bool)
        first[1:] = (hs[1:] != hs[:-1]) | (hd[1:] != hd[:-1])
        hs, hd, hw, hl = hs[first], hd[first], hw[first], hl[first]
        self._hub_link_key = hs.astype(np.int64) * m + hd
        self._hub_link_id = hl
        if not m:  # no hosts or switches: only direct device links route anything
            self.hub_cost, self.hub_routes = np.full((1, 1), np.inf), np.full((1, 1, 0), -1)
            return
        graph = csr_matrix((hw, (hs, hd)), shape=(m, m))
        self.hub_cost, pred = dijkstra(graph, directed=True, return_predecessors=True)
        self.hub_routes = self._walk(pred, m)

    def _walk(self, pred: np.ndarray, m: int) -> np.ndarray:
        """(m, m, L) link ids of the hub-to-hub shortest paths, padded with -1."""
        steps: list[np.ndarray] = []
        i, j = np.meshgrid(np.arange(m), np.arange(m), indexing="ij")
        cur = j.copy()
        live = pred >= 0
        while live.any():
            prev = np.where(live, pred[i, cur], 0)
            key = prev.astype(np.int64) * m + cur
            pos = np.searchsorted(self._hub_link_key, key)
            link = self._hub_link_id[np.minimum(pos, len(self._hub_link_id) - 1)]
            steps.append(np.where(live, link, -1))
            cur = np.where(live, prev, cur)
            live = live & (cur != i) & (pred[i, cur] >= 0)
        if not steps:
            return np.full((m, m, 0), -1, np.int64)
        # walked from the destination back: reverse, then push the -1 padding to the end
        table = np.stack(steps[::-1], axis=-1)
        pad = np.argsort(table < 0, axis=-1, kind="stable")
        return np.take_along_axis(table, pad, axis=-1)

    def _build_attachments(self, src: np.ndarray, dst: np.ndarray, weight: np.ndarray) -> None:
        n = self.n

        def table(mask: np.ndarray, owner: np.ndarray, other: np.ndarray):
            ids = np.flatnonzero(mask)
            k = max(1, int(np.bincount(owner[ids], minlength=n).max(initial=0)))
            hubs = np.zeros((n, k), np.int64)
            cost = np.full((n, k), np.inf)
            link = np.full((n, k), -1, np.int64)
            order = ids[np.argsort(owner[ids], kind="stable")]
            own = owner[order]
            slot = np.arange(len(order)) - np.searchsorted(own, own)
            hubs[own, slot], cost[own, slot], link[own, slot] = other[order] - n, \
                weight[order], order
            return hubs, cost, link

        self.up_hub, self.up_cost, self.up_link = table((src < n) & (dst >= n), src, dst)
        self.down_hub, self.down_cost, self.down_link = table((src >= n) & (dst < n), dst, src)
        direct = np.flatnonzero((src < n) & (dst < n))
        # fastest direct link per ordered device pair, kept sparse (usually there are none)
        self._direct: dict[tuple[int, int], int] = {}
        for lid in direct[np.argsort(-weight[direct], kind="stable")]:
            self._direct[(int(src[lid]), int(dst[lid]))] = int(lid)
        self._weight = weight

    # -- scalar lookups ---------------------------------------------------------------------
    def _ends(self, v: int, up: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if v >= self.n:  # a hub is its own attachment, at no cost
            return np.array([v - self.n]), np.zeros(1), np.array([-1])
        if up:
            return self.up_hub[v], self.up_cost[v], self.up_link[v]
        return self.down_hub[v], self.down_cost[v], self.down_link[v]

    def route(self, a: int, b: int) -> list[int]:
        """Link ids from vertex ``a`` to vertex ``b`` (devices first, then hubs); [] if a == b.

        Raises :class:`ClusterError` when no route exists.
        """
        if a == b:
            return []
        uh, uc, ul = self._ends(a, up=True)
        dh, dc, dl = self._ends(b, up=False)
        total = uc[:, None] + self.hub_cost[uh[:, None], dh[None, :]] + dc[None, :]
        k1, k2 = np.unravel_index(np.argmin(total), total.shape)
        best = total[k1, k2]
        direct = self._direct.get((a, b))
        if direct is not None and self._weight[direct] <= best:
            return [direct]
        if not np.isfinite(best):
            raise ClusterError(f"no route from {self.vertex[a]!r} to {self.vertex[b]!r}: "
                               "add links that connect them (through a host or switch)")
        middle = self.hub_routes[uh[k1], dh[k2]]
        path = [int(ul[k1])] + [int(x) for x in middle if x >= 0] + [int(dl[k2])]
        return [x for x in path if x >= 0]

    def ring(self, members: np.ndarray) -> tuple[float, float]:
        """(bandwidth, latency) of a ring over device indices ``members``, in that order.

        The bandwidth is the slowest link's achieved rate divided by the number of ring hops
        that cross it at once; the latency is the slowest hop's.
        """
        if len(members) < 2:
            return float("inf"), 0.0
        used: dict[int, int] = {}
        latency = 0.0
        for a, b in zip(members, np.roll(members, -1)):
            path = self.route(int(a), int(b))
            for lid in path:
                used[lid] = used.get(lid, 0) + 1
            latency = max(latency, float(self.link_latency[path].sum()))
        bandwidth = min(self.rate[lid] / count for lid, count in used.items())
        return float(bandwidth), latency

    # -- dense tables over device pairs -----------------------------------------------------
    def _slots(self) -> Iterator[tuple[int, int]]:
        """(k1, k2) slot pairs: uplink slot of the source, downlink slot of the destination."""
        for k1 in range(self.up_hub.shape[1]):
            for k2 in range(self.down_hub.shape[1]):
                yield k1, k2

    @cached_property
    def _choice(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per device pair: index of the chosen (uplink, downlink) slot pair (-1: a direct
        device link wins), and whether a route exists; each (n, n)."""
        n = self.n
        best = np.full((n, n), np.inf)
        pick = np.zeros((n, n), np.int16)
        for s, (k1, k2) in enumerate(self._slots()):
            # two plain takes (rows, then columns) are much faster than one 2-D fancy index
            cost = self.hub_cost[self.up_hub[:, k1]][:, self.down_hub[:, k2]]
            cost += self.up_cost[:, k1, None] + self.down_cost[None, :, k2]
            better = cost < best
            best[better], pick[better] = cost[better], s
        for (a, b), lid in self._direct.items():
            if self._weight[lid] <= best[a, b]:
                best[a, b], pick[a, b] = self._weight[lid], -1
        np.fill_diagonal(best, 0.0)
        return pick, np.isfinite(best)

    def _pair_table(self, per_link: np.ndarray, hub: np.ndarray, combine: np.ufunc,
                    empty: float) -> tuple[np.ndarray, np.ndarray]:
        """Combine a per-link figure along every pair's chosen route into an (n, n) table."""
        pick, reachable = self._choice
        ext = np.append(per_link, empty)          # index -1 (no link) reads ``empty``
        table = np.full(pick.shape, empty)
        for s, (k1, k2) in enumerate(self._slots()):
            value = hub[self.up_hub[:, k1]][:, self.down_hub[:, k2]]
            value = combine(combine(value, ext[self.up_link[:, k1]][:, None]),
                            ext[self.down_link[:, k2]][None, :])
            np.copyto(table, value, where=pick == s)
        for (a, b), lid in self._direct.items():
            if pick[a, b] == -1:
                table[a, b] = per_link[lid]
        return table, reachable

    @cached_property
    def bandwidth(self) -> np.ndarray:
        """(n, n) achieved bottleneck bandwidth; inf on the diagonal, 0 where no route."""
        hub = np.append(self.rate, np.inf)[self.hub_routes].min(-1, initial=np.inf)
        table, reachable = self._pair_table(self.rate, hub, np.minimum, np.inf)
        table[~reachable] = 0.0
        np.fill_diagonal(table, np.inf)
        return table

    @cached_property
    def latency(self) -> np.ndarray:
        """(n, n) summed link latency; 0 on the diagonal, inf where no route."""
        hub = np.append(self.link_latency, 0.0)[self.hub_routes].sum(-1)
        table, reachable = self._pair_table(self.link_latency, hub, np.add, 0.0)
        table[~reachable] = np.inf
        np.fill_diagonal(table, 0.0)
        return table

    @cached_property
    def routes(self) -> np.ndarray:
        """(n, n, L) int32: link ids of the route from device i to device j, -1 padded."""
        n = self.n
        pick, reachable = self._choice
        routes = np.full((n, n, 2 + self.hub_routes.shape[-1]), -1, np.int32)
        for s, (k1, k2) in enumerate(self._slots()):
            mask = pick == s
            rows, cols = np.nonzero(mask)
            routes[rows, cols, 0] = self.up_link[rows, k1]
            routes[rows, cols, 1:-1] = self.hub_routes[self.up_hub[rows, k1],
                                                       self.down_hub[cols, k2]]
            routes[rows, cols, -1] = self.down_link[cols, k2]
        for (a, b), lid in self._direct.items():
            if pick[a, b] == -1:
                routes[a, b] = -1
                routes[a, b, 0] = lid
        routes[~reachable] = -1
        routes[np.arange(n), np.arange(n)] = -1
        # push padding to the end so a route reads left to right
        return np.take_along_axis(routes, np.argsort(routes < 0, axis=-1, kind="stable"), -1)
