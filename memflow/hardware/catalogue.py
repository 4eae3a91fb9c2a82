"""What memflow knows about GPUs, edge boards and links, with where each figure comes from.

Peak figures are the vendors' (``shared/REFERENCES.md``, "Hardware"): dense tensor-core FP16
where the GPU has tensor cores, per-direction link bandwidth. Achieved rates are below peak: the
fractions (``compute_efficiency``, ``memory_efficiency``, ``launch_overhead`` of a GPU, the
``efficiency`` of a link kind) are rows of :data:`memflow.hardware.efficiency.EFFICIENCY`,
each with its source. ``memcpy`` and ``loopback`` links have no datasheet: their bandwidth is
what :meth:`Cluster.local <memflow.hardware.local.local>` measures on this machine.

>>> GPUS["A100-80GB"].mem_bandwidth
2039000000000.0
>>> sorted(LINK_KINDS)[:3]
['ethernet', 'ib-edr', 'ib-hdr']
"""
from __future__ import annotations

from dataclasses import dataclass

from .efficiency import efficiency

__all__ = ["GPU", "LinkKind", "GPUS", "EDGE_BOARDS", "LINK_KINDS", "GIB", "lookup_gpu"]

GIB = 1024 ** 3
GB = 1e9
TFLOP = 1e12


@dataclass(frozen=True)
class GPU:
    """One accelerator model: its memory, peak rates and the links it comes with.

    ``nvlink_bandwidth`` is per direction (half the vendors' "total" figure), 0 without NVLink.
    ``bf16`` says whether the GPU computes bfloat16 in hardware at its FP16 peak: only NVIDIA
    GPUs of compute capability 8.0 and later (Ampere: A100, A10, A40, RTX 30xx, Jetson Orin;
    Ada: L4, RTX 40xx; Hopper) have BF16 tensor cores and bf16 arithmetic (CUDA Programming
    Guide, ``__nv_bfloat16`` arithmetic needs ``sm_80``; PyTorch's
    ``torch.cuda.is_bf16_supported()`` asks for capability 8.0). Kepler, Maxwell, Pascal,
    Volta and Turing GPUs (K80, Titan X, P100, V100, T4, Jetson Nano/TX2/Xavier) have none:
    bf16 matmuls there run at best at the FP32 rate, so the simulator charges them that.
    ``unified`` marks edge boards whose GPU shares one DRAM with the CPU.
    """

    name: str
    memory_bytes: int
    mem_bandwidth: float
    peak_flops_fp16: float
    peak_flops_fp32: float
    nvlink_bandwidth: float
    host_link: str
    default_ib: str
    nics_per_gpu: float
    bf16: bool
    unified: bool = False
    description: str = ""

    # achieved fractions of the peaks: rows of the efficiency table, with their sources
    @property
    def compute_efficiency(self) -> float:
        return efficiency(self.name, "compute_efficiency")

    @property
    def memory_efficiency(self) -> float:
        return efficiency(self.name, "memory_efficiency")

    @property
    def launch_overhead(self) -> float:
        return efficiency(self.name, "launch_overhead")


@dataclass(frozen=True)
class LinkKind:
    """Defaults of one kind of link: peak bandwidth per direction, efficiency, latency per hop."""

    name: str
    bandwidth: float
    efficiency: float
    latency: float
    description: str


# nics_per_gpu: NICs of a typical node of that era divided by its GPUs — DGX A100 and DGX H100
# give every GPU its own compute NIC, DGX-1 (P100, V100) has 4 for 8 GPUs; older servers one.
GPUS: dict[str, GPU] = {g.name: g for g in (
    GPU("K80-12GB", 12 * GIB, 240 * GB, 4.4 * TFLOP, 4.4 * TFLOP, 0, "pcie3", "ib-edr", 0.125,
        False,
        description="Tesla K80, one GK210 of the board; no fast FP16 (runs at the FP32 rate)"),
    GPU("TitanX-12GB", 12 * GIB, 336 * GB, 6.6 * TFLOP, 6.6 * TFLOP, 0, "pcie3", "ib-edr", 0.125,
        False,
        description="GeForce GTX Titan X (Maxwell); no fast FP16 (runs at the FP32 rate)"),
    GPU("P100-16GB", 16 * GIB, 732 * GB, 21 * TFLOP, 10.6 * TFLOP, 80 * GB, "pcie3", "ib-edr", 0.5,
        False, description="Tesla P100 SXM2; FP16 via half2 at twice FP32; no BF16"),
    GPU("V100-16GB", 16 * GIB, 900 * GB, 125 * TFLOP, 15.7 * TFLOP, 150 * GB, "pcie3", "ib-edr",
        0.5, False, description="Tesla V100 SXM2 16 GB; tensor cores (FP16 only, no BF16)"),
    GPU("V100-32GB", 32 * GIB, 900 * GB, 125 * TFLOP, 15.7 * TFLOP, 150 * GB, "pcie3", "ib-edr",
        0.5, False, description="Tesla V100 SXM2 32 GB; tensor cores (FP16 only, no BF16)"),
    GPU("A100-40GB", 40 * GIB, 1555 * GB, 312 * TFLOP, 19.5 * TFLOP, 300 * GB, "pcie4", "ib-hdr",
        1.0, True, description="A100 SXM4 40 GB; FP16/BF16 tensor cores"),
    GPU("A100-80GB", 80 * GIB, 2039 * GB, 312 * TFLOP, 19.5 * TFLOP, 300 * GB, "pcie4", "ib-hdr",
        1.0, True, description="A100 SXM4 80 GB; FP16/BF16 tensor cores"),
    GPU("H100-80GB", 80 * GIB, 3350 * GB, 989 * TFLOP, 67 * TFLOP, 450 * GB, "pcie5", "ib-ndr",
        1.0, True, description="H100 SXM5 80 GB; FP16/BF16 tensor cores"),
    GPU("H200-141GB", 141 * GIB, 4800 * GB, 989 * TFLOP, 67 * TFLOP, 450 * GB, "pcie5", "ib-ndr",
        1.0, True, description="H200 SXM 141 GB; H100's compute with faster HBM3e"),
)}

# Edge boards: one LPDDR pool shared by CPU and GPU. memory_bytes is what the GPU can use after
# a headless JetPack and the CUDA context take about 1 GiB; the host gets no memory of its own
# (see presets: offloading to the "host" of a unified board frees nothing). FLOP/s are NVIDIA's
# published GPU figures (Nano, TX2: CUDA cores, FP16 at twice FP32; Xavier NX, Orin Nano: dense
# tensor-core FP16 = 48 or 32 tensor cores at 1.1 GHz or 625 MHz).
EDGE_BOARDS: dict[str, GPU] = {g.name: g for g in (
    GPU("jetson-nano-4GB", 3 * GIB, 25.6 * GB, 0.472 * TFLOP, 0.236 * TFLOP, 0, "unified",
        "ethernet", 1.0, False, unified=True,
        description="Jetson Nano 4 GB: 128-core Maxwell, LPDDR4 25.6 GB/s"),
    GPU("jetson-tx2-8GB", 7 * GIB, 59.7 * GB, 1.33 * TFLOP, 0.665 * TFLOP, 0, "unified",
        "ethernet", 1.0, False, unified=True,
        description="Jetson TX2 8 GB: 256-core Pascal, LPDDR4 59.7 GB/s"),
    GPU("jetson-xavier-nx-8GB", 7 * GIB, 51.2 * GB, 6.76 * TFLOP, 0.845 * TFLOP, 0, "unified",
        "ethernet", 1.0, False, unified=True,
        description="Jetson Xavier NX 8 GB: 384-core Volta, 48 tensor cores, LPDDR4x 51.2 GB/s"),
    GPU("jetson-orin-nano-8GB", 7 * GIB, 68 * GB, 10.24 * TFLOP, 1.28 * TFLOP, 0, "unified",
        "ethernet", 1.0, True, unified=True,
        description="Jetson Orin Nano 8 GB: 1024-core Ampere, 32 tensor cores (FP16/BF16), "
                    "LPDDR5 68 GB/s"),
)}

LINK_KINDS: dict[str, LinkKind] = {
    name: LinkKind(name, bw, efficiency(name, "efficiency"), lat, text)
    for name, bw, lat, text in (
    ("nvlink", 0.0, 1e-6, "NVLink/NVSwitch port; bandwidth depends on the GPU"),
    ("pcie3", 15.75 * GB, 5e-6, "PCIe 3.0 x16"),
    ("pcie4", 31.5 * GB, 5e-6, "PCIe 4.0 x16"),
    ("pcie5", 63 * GB, 5e-6, "PCIe 5.0 x16"),
    ("ib-edr", 12.5 * GB, 2.5e-6, "InfiniBand EDR, 100 Gb/s per NIC"),
    ("ib-hdr", 25 * GB, 2.5e-6, "InfiniBand HDR, 200 Gb/s per NIC"),
    ("ib-ndr", 50 * GB, 2.5e-6, "InfiniBand NDR, 400 Gb/s per NIC"),
    ("ethernet", 1.25 * GB, 2.5e-5, "10 Gb Ethernet (TCP)"),
    ("unified", 0.0, 5e-6,
     "copy inside one DRAM shared by CPU and GPU; half the DRAM bandwidth (read + write)"),
    ("memcpy", 0.0, 1e-6, "a copy inside one machine's DRAM (a CPU device to its host); "
                          "bandwidth measured"),
    ("loopback", 0.0, 5e-5, "gloo over TCP loopback between processes of one machine; "
                            "bandwidth and latency measured"),
)}


def _key(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


# Accepted spellings: the full name and, where a GPU comes in one memory size, the bare model.
_ALIASES: dict[str, str] = {}
for _name in (*GPUS, *EDGE_BOARDS):
    _ALIASES[_key(_name)] = _name
for _bare, _full in (("K80", "K80-12GB"), ("TitanX", "TitanX-12GB"), ("P100", "P100-16GB"),
                     ("H100", "H100-80GB"), ("H200", "H200-141GB")):
    _ALIASES[_key(_bare)] = _full


def lookup_gpu(name: str) -> GPU | None:
    """The catalogue entry for ``name`` (case, dashes and spaces ignored), or None.

    >>> lookup_gpu("v100 16gb").name
    'V100-16GB'
    >>> lookup_gpu("Jetson-Nano-4GB").unified
    True
    """
    full = _ALIASES.get(_key(name))
    if full is None:
        return None
    return GPUS.get(full) or EDGE_BOARDS[full]
