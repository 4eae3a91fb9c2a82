"""Clusters by name ("4xV100-16GB", "16x8xH100-80GB", "jetson-nano-4GB") and by parameters.

Grammar, case-insensitive: ``[NODES x] [GPUS x] GPU [-PCIe] [-IB-EDR|-IB-HDR|-IB-NDR|-Ethernet]``.

* ``4xV100-16GB`` — one node of 4 GPUs joined by NVLink where the GPU has it (through an
  NVSwitch-like hub per node: every GPU gets its full NVLink bandwidth to any peer; exact for
  HGX A100/H100 and DGX-2, optimistic for point-to-point pairs of DGX-1's P100/V100 mesh),
  else by PCIe through the host.
* ``4xV100-16GB-PCIe`` — force PCIe between the GPUs.
* ``16x8xH100-80GB`` — 16 nodes of 8; nodes meet at one network switch over InfiniBand (EDR for
  K80 to V100, HDR for A100, NDR for H100/H200 unless a suffix says otherwise). A node's link
  to the switch carries all its NICs: one per GPU on A100/H100/H200 (DGX A100, DGX H100), one
  per two GPUs on P100/V100 (DGX-1), one per node before.
* Edge boards (``jetson-nano-4GB``, ``jetson-tx2-8GB``, ``jetson-xavier-nx-8GB``,
  ``jetson-orin-nano-8GB``): one GPU sharing one LPDDR pool with the CPU. The device gets the
  pool minus ~1 GiB for the OS; its host gets no memory of its own, so a strategy that offloads
  there runs out of host memory — honestly, since offloading on such a board frees nothing. The
  GPU-host link is a ``unified`` copy at half the DRAM bandwidth. ``4xjetson-nano-4GB`` is four
  boards over 1 Gb Ethernet.

Host memory defaults to 4x the GPU memory of a node (DGX-1: 512 GB for 8x16 GB; DGX A100 and
DGX H100: 2 TB for 8x80 GB, 3.2x).

>>> c = Cluster.preset("16x8xH100-80GB")
>>> len(c), c.links.loc[c.route("gpu0", "gpu8"), "kind"].tolist()
(128, ['pcie5', 'ib-ndr', 'ib-ndr', 'pcie5'])
>>> Cluster.preset("4xV100-16GB-PCIe").links["kind"].unique().tolist()
['pcie3']
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .._units import parse_bytes
from ..errors import ClusterError
from .catalogue import EDGE_BOARDS, GPU, GPUS, LINK_KINDS, lookup_gpu
from .cluster import Cluster

__all__ = ["preset", "presets", "build", "PRESET_NAMES"]

EDGE_ETHERNET = 0.125e9  # Jetson boards have 1 Gb Ethernet
HOST_MEMORY_FACTOR = 4

PRESET_NAMES = (
    "1xK80", "4xK80", "1xTitanX", "4xTitanX", "4xP100", "1xV100-16GB", "4xV100-16GB",
    "4xV100-16GB-PCIe", "8xV100-32GB", "4x8xV100-32GB", "1xA100-40GB", "8xA100-40GB",
    "1xA100-80GB", "8xA100-80GB", "4x8xA100-80GB", "1xH100-80GB", "8xH100-80GB",
    "16x8xH100-80GB", "128x8xH100-80GB", "8xH200-141GB", "16x8xH200-141GB",
    *EDGE_BOARDS, "4xjetson-nano-4GB",
)

_SUFFIX = re.compile(r"-(pcie[345]?|ib-(?:edr|hdr|ndr)|eth(?:ernet)?)$", re.I)
_COUNTS = re.compile(r"^(?:(\d+)x)?(?:(\d+)x)?(.+)$", re.I)


@dataclass(frozen=True)
class _Spec:
    gpu: GPU
    gpus_per_node: int
    nodes: int
    intra: str
    inter: str | None


def _valid_names() -> str:
    return (f"GPUs: {', '.join(GPUS)}; edge boards: {', '.join(EDGE_BOARDS)}; patterns: "
            "'GPU', 'NxGPU', 'NODESxNxGPU', with an optional '-PCIe' and/or "
            "'-IB-EDR'/'-IB-HDR'/'-IB-NDR'/'-Ethernet' suffix (e.g. '4xV100-16GB-PCIe', "
            "'16x8xH100-80GB-IB-HDR')")


def _parse(name: str) -> _Spec:
    rest, intra, inter = str(name).strip(), None, None
    while (m := _SUFFIX.search(rest)):
        word = m.group(1).lower()
        if word.startswith("pcie"):
            intra = word
        else:
            inter = "ethernet" if word.startswith("eth") else word
        rest = rest[:m.start()]
    counts = _COUNTS.match(rest)
    gpu = lookup_gpu(counts.group(3)) if counts else None
    if gpu is None:
        raise ClusterError(f"unknown cluster preset {name!r}; valid: {_valid_names()}")
    first, second = counts.group(1), counts.group(2)
    if second is not None:
        nodes, per_node = int(first), int(second)
    else:
        nodes, per_node = 1, int(first or 1)
    if gpu.unified:  # a board holds one GPU: "4xjetson-..." means four boards
        if second is not None and per_node != 1:
            raise ClusterError(f"{name!r}: an edge board has one GPU; write '{per_node * nodes}x"
                               f"{gpu.name}' for that many boards over Ethernet")
        nodes, per_node = nodes * per_node, 1
    if intra == "pcie":
        intra = gpu.host_link
    return _Spec(gpu, per_node, nodes, intra or _default_intra(gpu, per_node), inter)


def _default_intra(gpu: GPU, per_node: int) -> str:
    if gpu.unified:
        return "unified"
    return "nvlink" if gpu.nvlink_bandwidth and per_node > 1 else gpu.host_link


def preset(name: str) -> Cluster:
    """The cluster a preset name describes (see the module's grammar).

    >>> preset("8xA100-80GB").summary().splitlines()[0]
    "Cluster '8xA100-80GB': 8 devices on 1 node(s), 640 GiB device memory, 2.50 TiB host memory"
    """
    s = _parse(name)
    return build(s.gpu.name, s.gpus_per_node, s.nodes, intra=s.intra, inter=s.inter,
                 name=str(name))


def presets() -> pd.DataFrame:
    """One row per named preset: ``name``, ``devices``, ``nodes``, ``gpu``, ``memory``
    (bytes per device), ``interconnect``, ``description``.

    >>> t = presets()
    >>> t.loc[t["name"] == "4xV100-16GB", "interconnect"].item()
    'NVLink 150 GB/s/dir, PCIe3 to host'
    """
    rows = []
    for name in PRESET_NAMES:
        s = _parse(name)
        rows.append({"name": name, "devices": s.gpus_per_node * s.nodes, "nodes": s.nodes,
                     "gpu": s.gpu.name, "memory": s.gpu.memory_bytes,
                     "interconnect": _interconnect(s), "description": s.gpu.description})
    return pd.DataFrame(rows)


def _interconnect(s: _Spec) -> str:
    if s.gpu.unified:
        parts = [f"unified LPDDR ({s.gpu.mem_bandwidth / 1e9:g} GB/s)"]
    elif s.intra == "nvlink":
        parts = [f"NVLink {s.gpu.nvlink_bandwidth / 1e9:g} GB/s/dir",
                 f"{_label(s.gpu.host_link)} to host"]
    else:
        parts = [f"{_label(s.intra)} via host"]
    if s.nodes > 1:
        inter = s.inter or _default_inter(s.gpu)
        parts.append(f"{_label(inter)} x{_nics(s.gpu, s.gpus_per_node, inter)} per node")
    return ", ".join(parts)


def _label(kind: str) -> str:
    if kind.startswith("pcie"):
        return "PCIe" + kind[4:]
    return kind.replace("ib-", "IB ").upper() if kind.startswith("ib-") else kind.capitalize()


def _default_inter(gpu: GPU) -> str:
    return "ethernet" if gpu.unified else gpu.default_ib


def _nics(gpu: GPU, per_node: int, inter: str) -> int:
    return 1 if inter == "ethernet" else max(1, int(round(gpu.nics_per_gpu * per_node)))


def build(gpu: str, gpus_per_node: int = 8, nodes: int = 1, *, intra: str | None = None,
          inter: str | None = None, nics_per_node: int | None = None,
          inter_bandwidth: float | None = None, host_memory: float | str | None = None,
          name: str | None = None) -> Cluster:
    """A homogeneous cluster of ``nodes`` × ``gpus_per_node`` GPUs of one catalogue model.

    ``intra``: ``"nvlink"`` (default where the GPU has it), ``"pcie3"``/``"pcie4"``/
    ``"pcie5"`` or ``"unified"``. ``inter``: ``"ib-edr"``/``"ib-hdr"``/``"ib-ndr"``/
    ``"ethernet"`` (default: the GPU's era). ``nics_per_node`` and ``inter_bandwidth`` (per
    NIC, bytes/s) override the network; ``host_memory`` the host's bytes. Vectorized: 1,024
    GPUs build in milliseconds.

    >>> c = build("H100-80GB", gpus_per_node=8, nodes=128)
    >>> len(c), len(c.hosts), len(c.links)
    (1024, 128, 4352)
    """
    spec = lookup_gpu(gpu)
    if spec is None:
        raise ClusterError(f"unknown GPU {gpu!r}; valid: {_valid_names()}")
    g, n_nodes = int(gpus_per_node), int(nodes)
    if g < 1 or n_nodes < 1:
        raise ClusterError(f"gpus_per_node and nodes must be >= 1, got {g} and {n_nodes}")
    if spec.unified and g != 1:
        raise ClusterError(f"{spec.name}: an edge board has one GPU; use nodes={g * n_nodes}")
    intra = intra or _default_intra(spec, g)
    inter = inter or _default_inter(spec)
    for what, value, valid in (("intra", intra, ("nvlink", "pcie3", "pcie4", "pcie5", "unified")),
                               ("inter", inter, ("ib-edr", "ib-hdr", "ib-ndr", "ethernet"))):
        if value not in valid:
            raise ClusterError(f"{what}={value!r} is not a valid link kind here; valid: {valid}")
    if intra == "nvlink" and not spec.nvlink_bandwidth:
        raise ClusterError(f"{spec.name} has no NVLink; use intra={spec.host_link!r}")
    n = g * n_nodes
    dev = np.array([f"gpu{i}" for i in range(n)], dtype=object)
    node = np.arange(n) // g
    host_names = np.array([f"host{k}" for k in range(n_nodes)], dtype=object)
    host_of = host_names[node]
    memory = host_memory if host_memory is not None else \
        (0 if spec.unified else HOST_MEMORY_FACTOR * g * spec.memory_bytes)

    devices = pd.DataFrame({
        "node": node, "model": spec.name, "memory_bytes": float(spec.memory_bytes),
        "peak_flops_fp32": spec.peak_flops_fp32, "peak_flops_fp16": spec.peak_flops_fp16,
        "bf16": spec.bf16,
        "mem_bandwidth": spec.mem_bandwidth, "compute_efficiency": spec.compute_efficiency,
        "memory_efficiency": spec.memory_efficiency, "launch_overhead": spec.launch_overhead,
        "host": host_of}, index=pd.Index(dev, name="device"))
    hosts = pd.DataFrame({"node": np.arange(n_nodes), "memory_bytes": parse_bytes(memory)},
                         index=pd.Index(host_names, name="host"))

    # host link of every GPU (offload, prefetch, and PCIe peer traffic), both directions
    host_kind = spec.host_link if intra in ("nvlink", "unified") else intra
    host_bw = spec.mem_bandwidth / 2 if host_kind == "unified" else LINK_KINDS[host_kind].bandwidth
    blocks = [(dev, host_of, host_kind, host_bw), (host_of, dev, host_kind, host_bw)]
    switch_rows: list[tuple[str, int, str]] = []
    if intra == "nvlink":
        hub = np.array([f"nvsw{k}" for k in range(n_nodes)], dtype=object)[node]
        blocks += [(dev, hub, "nvlink", spec.nvlink_bandwidth),
                   (hub, dev, "nvlink", spec.nvlink_bandwidth)]
        switch_rows += [(f"nvsw{k}", k, "nvswitch") for k in range(n_nodes)]
    if n_nodes > 1:
        nics = nics_per_node or _nics(spec, g, inter)
        per_nic = inter_bandwidth or (EDGE_ETHERNET if spec.unified and inter == "ethernet"
                                      else LINK_KINDS[inter].bandwidth)
        sw = np.full(n_nodes, "switch", dtype=object)
        blocks += [(host_names, sw, inter, nics * per_nic), (sw, host_names, inter, nics * per_nic)]
        switch_rows.append(("switch", -1, "network"))
    links = pd.DataFrame({
        "src": np.concatenate([b[0] for b in blocks]),
        "dst": np.concatenate([b[1] for b in blocks]),
        "kind": np.concatenate([np.full(len(b[0]), b[2], dtype=object) for b in blocks]),
        "bandwidth": np.concatenate([np.full(len(b[0]), float(b[3])) for b in blocks]),
        "efficiency": np.nan, "latency": np.nan})
    switches = pd.DataFrame(switch_rows, columns=["switch", "node", "kind"]).set_index("switch")
    return Cluster(devices, hosts, links, switches,
                   name=name or (f"{n_nodes}x{g}x{spec.name}" if n_nodes > 1 else
                                 f"{g}x{spec.name}"))


def _attach() -> None:
    # Also classmethods of Cluster (Cluster.preset("4xV100-16GB")), where users look for them.
    for fn in (preset, presets, build):
        setattr(Cluster, fn.__name__, staticmethod(fn))


_attach()
