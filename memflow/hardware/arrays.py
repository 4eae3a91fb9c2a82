"""A cluster as numpy arrays, for a simulator's inner loop.

Built once per cluster (``cluster.arrays``) and never copied: per-device figures indexed by
device position, per-link figures indexed by link row (each row is one serial channel), and
the :class:`~memflow.hardware.routing.Routing` tables that map a device pair to the channels a
transfer occupies, its bottleneck bandwidth and its latency.

>>> from memflow.hardware import Cluster
>>> a = Cluster.preset("2x4xV100-16GB").arrays
>>> a.memory.shape, a.route(0, 4).tolist()
((8,), [0, 32, 35, 12])
>>> float(a.transfer_time(0, 1, 120e9))  # NVLink: 150 GB/s per direction at 0.8
1.000002
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .routing import Routing

__all__ = ["ClusterArrays"]


@dataclass(frozen=True, eq=False)
class ClusterArrays:
    """Per-device and per-link arrays plus route lookups. Index devices by position."""

    devices: pd.Index
    node: np.ndarray
    host: np.ndarray                 # position of each device's host in cluster.hosts
    memory: np.ndarray
    flops_fp32: np.ndarray
    flops_fp16: np.ndarray
    bf16: np.ndarray                 # bool: bfloat16 at flops_fp16, else at flops_fp32
    mem_bandwidth: np.ndarray
    compute_efficiency: np.ndarray
    memory_efficiency: np.ndarray
    launch_overhead: np.ndarray
    host_memory: np.ndarray          # per host
    link_bandwidth: np.ndarray       # peak per direction, per link row
    link_rate: np.ndarray            # bandwidth · efficiency: what a transfer achieves
    link_latency: np.ndarray
    routing: Routing = field(repr=False)

    @classmethod
    def from_tables(cls, devices: pd.DataFrame, hosts: pd.DataFrame, links: pd.DataFrame,
                    switches: pd.DataFrame) -> "ClusterArrays":
        """Build from validated tables (see :func:`memflow.hardware.tables.validate`)."""
        rate = (links["bandwidth"] * links["efficiency"]).to_numpy(np.float64)
        hubs = hosts.index.append(switches.index)
        routing = Routing(devices.index, hubs,
                          pd.DataFrame({"src": links["src"], "dst": links["dst"],
                                        "rate": rate, "latency": links["latency"]}))

        def col(name: str) -> np.ndarray:
            return devices[name].to_numpy(np.float64)

        return cls(devices=devices.index, node=devices["node"].to_numpy(np.int64),
                   host=hosts.index.get_indexer(devices["host"]),
                   memory=col("memory_bytes"), flops_fp32=col("peak_flops_fp32"),
                   flops_fp16=col("peak_flops_fp16"), bf16=devices["bf16"].to_numpy(bool),
                   mem_bandwidth=col("mem_bandwidth"),
                   compute_efficiency=col("compute_efficiency"),
                   memory_efficiency=col("memory_efficiency"),
                   launch_overhead=col("launch_overhead"),
                   host_memory=hosts["memory_bytes"].to_numpy(np.float64),
                   link_bandwidth=links["bandwidth"].to_numpy(np.float64), link_rate=rate,
                   link_latency=links["latency"].to_numpy(np.float64), routing=routing)

    def peak_flops(self, dtype: str) -> np.ndarray:
        """Peak FLOP/s per device for a dtype name: the FP16 column for 16-bit floats, but
        the FP32 one for bfloat16 on devices without bf16 units.

        >>> from memflow.hardware import Cluster
        >>> float(Cluster.preset("1xA100-80GB").arrays.peak_flops("bfloat16")[0])
        312000000000000.0
        >>> float(Cluster.preset("1xV100-16GB").arrays.peak_flops("bfloat16")[0])
        15700000000000.0
        """
        name = str(dtype).replace("torch.", "")
        if name in ("bfloat16", "bf16"):
            return np.where(self.bf16, self.flops_fp16, self.flops_fp32)
        return self.flops_fp16 if name in ("float16", "half", "fp16") else self.flops_fp32

    def route(self, a: int, b: int) -> np.ndarray:
        """Link rows (serial channels) a transfer from device ``a`` to device ``b`` crosses."""
        return np.asarray(self.routing.route(a, b), np.int64)

    def host_route(self, device: int, to_host: bool = True) -> np.ndarray:
        """Link rows between a device and its own host (offload: ``to_host``; prefetch: not)."""
        hub = len(self.devices) + int(self.host[device])
        pair = (device, hub) if to_host else (hub, device)
        return np.asarray(self.routing.route(*pair), np.int64)

    @property
    def bandwidth(self) -> np.ndarray:
        """(n, n) achieved bottleneck bandwidth between devices (inf on the diagonal)."""
        return self.routing.bandwidth

    @property
    def latency(self) -> np.ndarray:
        """(n, n) route latency between devices (0 on the diagonal)."""
        return self.routing.latency

    @property
    def routes(self) -> np.ndarray:
        """(n, n, L) link rows of every device pair's route, padded with -1."""
        return self.routing.routes

    def transfer_time(self, a: int, b: int, nbytes: float) -> float:
        """Seconds to move ``nbytes`` from device ``a`` to ``b`` on idle links (cut-through)."""
        if a == b:
            return 0.0
        path = self.route(a, b)
        return float(self.link_latency[path].sum() + nbytes / self.link_rate[path].min())
