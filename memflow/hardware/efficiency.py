"""The time model's efficiency constants: one table, a source per row.

Peak rates are datasheet figures (``catalogue``); what a real step achieves is a fraction of
them. Every such fraction (and the other fixed rates of the time model) is a row of
:data:`EFFICIENCY` — ``applies_to`` (a GPU or edge board of the catalogue, a link kind, or
``"cpu"``), ``figure`` (the device or link column it fills), ``value``, ``source`` (the
datasheet, paper or measurement it comes from; "assumption" where none is published) and
``basis``: ``published`` (a datasheet, paper or vendor benchmark), ``assumption`` or
``measured`` (on this machine, by ``Cluster.local()`` or in the simulating process). The
catalogue's GPUs and link kinds read their figures from here, and
:func:`memflow.hardware.calibrate` replaces them with figures fitted to measured op times.

>>> efficiency("V100-16GB", "memory_efficiency")
0.88
>>> table().query("applies_to == 'V100-16GB'")["value"].tolist()
[0.6, 0.88, 5e-06]
>>> sorted(table().query("applies_to == 'cpu'")["basis"].unique())
['assumption', 'measured']
"""
from __future__ import annotations

from typing import NamedTuple

import pandas as pd

__all__ = ["Efficiency", "EFFICIENCY", "efficiency", "table", "SOURCES", "BASES"]


class Efficiency(NamedTuple):
    """One constant of the time model: what it applies to, its value, where it comes from."""

    applies_to: str
    figure: str
    value: float
    source: str
    basis: str


# The sources, each cited once and referred to by key below.
SOURCES: dict[str, str] = {
    "sgemm": "cuBLAS SGEMM reaches ~75% of the FP32 peak on Kepler to Pascal (Lai & Seznec, "
             "'Performance upper bound analysis and optimization of SGEMM on Fermi and Kepler "
             "GPUs', CGO 2013; NVIDIA cuBLAS performance notes)",
    "tensor-core": "large GEMMs reach 60-65% of the dense tensor-core peak on V100 to H200 "
                   "(NVIDIA Deep Learning Performance Guide, 'Matrix multiplication'); "
                   "Megatron-LM's 52% end-to-end MFU on A100 also counts non-GEMM ops, charged "
                   "to memory bandwidth here (Narayanan et al., SC 2021)",
    "gddr5": "streaming kernels reach ~80% of GDDR5 peak bandwidth (Jia et al., 'Dissecting the "
             "NVIDIA Volta GPU architecture via microbenchmarking', 2018, Kepler/Maxwell tables)",
    "hbm": "streaming kernels reach 85-90% of HBM peak bandwidth (Jia et al. 2018: 790 of "
           "900 GB/s on V100; NVIDIA's STREAM-like babelstream figures on A100/H100)",
    "lpddr": "assumption: ~70% of LPDDR peak bandwidth on Jetson boards (no published "
             "microbenchmark cited; calibrate on the board)",
    "launch": "PyTorch eager dispatch plus cudaLaunchKernel, 4-6 us per op on x86 hosts "
              "(PyTorch performance tuning guide; CUDA launch latency ~5 us)",
    "launch-arm": "assumption: Jetson's ARM cores dispatch at about half an x86 host's speed",
    "pcie": "pinned cudaMemcpy reaches 12-13 of 15.75 GB/s on PCIe 3.0, ~25 of 31.5 on 4.0 "
            "(CUDA samples bandwidthTest)",
    "nvlink": "nccl-tests bus bandwidth ~240 of 300 GB/s on DGX A100 (NVIDIA nccl-tests)",
    "infiniband": "ib_write_bw reaches >90% of the line rate (perftest)",
    "ethernet": "assumption: TCP sockets (gloo, NCCL's socket transport) reach ~70% of line rate",
    "unified": "assumption: a copy inside one LPDDR pool reaches ~70% of half its bandwidth",
    "measured": "measured on this machine by memflow.Cluster.local(): the achieved rate is "
                "the figure itself, so its efficiency is 1",
    "cpu-step": "measured on this machine by memflow.Cluster.local() (one thread; by wall and "
                "by CPU time): a CPU step's costs besides large matrix products — backward "
                "and small-kernel FLOP/s, the bandwidth of a mix of memory-bound training ops, "
                "seconds per op dispatched, per autograd node, per parameter tensor stepped, "
                "per saved tensor through a Python hook, bytes per second into new host images "
                "(memflow.hardware.local.STEP_FIGURES), and the shape-class rate table "
                "(memflow.hardware.kernels: matrix products as nn.Linear runs them, each "
                "kernel after an L2 cache's worth of other traffic, as in a step); charged at "
                "face value, so the "
                "efficiency is 1, and the time model adds them up on CPU devices only "
                "(memflow.sim.cpu_time.cpu_compute)",
    "cpu-compress": "measured in the simulating process by memflow.sim.cpu_time."
                    "cpu_compressor_cost: export's compressor (SZ3 where pysz is installed) "
                    "packing and unpacking a 1 MiB and a 16 KiB ReLU map on one thread, a "
                    "line through the two: bytes per second and a fixed cost per call (one "
                    "per saved map, memflow.sim.cpu_time.compressed_tensors)",
    "cpu-adam": "assumption after ZeRO-Offload's CPU-Adam (Ren et al., USENIX ATC 2021): ~30 "
                "bytes of DRAM traffic per parameter, ~1e9 parameters/s on a two-socket server",
}

BASES: dict[str, str] = {
    **{key: "published" for key in SOURCES},
    **{key: "assumption" for key in ("lpddr", "launch-arm", "ethernet", "unified", "cpu-adam")},
    **{key: "measured" for key in ("measured", "cpu-step", "cpu-compress")}}
"""Each source's basis: ``published``, ``assumption`` or ``measured`` (module doc)."""


def _row(applies_to: str, figure: str, value: float, key: str) -> Efficiency:
    return Efficiency(applies_to, figure, value, SOURCES[key], BASES[key])


_GPU_ROWS = (  # (names, compute, memory, launch, their sources)
    (("K80-12GB", "TitanX-12GB"), 0.75, 0.8, 6e-6, ("sgemm", "gddr5", "launch")),
    (("P100-16GB",), 0.75, 0.85, 5e-6, ("sgemm", "hbm", "launch")),
    (("V100-16GB", "V100-32GB"), 0.6, 0.88, 5e-6, ("tensor-core", "hbm", "launch")),
    (("A100-40GB", "A100-80GB"), 0.65, 0.88, 4e-6, ("tensor-core", "hbm", "launch")),
    (("H100-80GB", "H200-141GB"), 0.6, 0.9, 4e-6, ("tensor-core", "hbm", "launch")),
    (("jetson-nano-4GB", "jetson-tx2-8GB"), 0.7, 0.7, 1e-5, ("sgemm", "lpddr", "launch-arm")),
    (("jetson-xavier-nx-8GB", "jetson-orin-nano-8GB"), 0.65, 0.7, 1e-5,
     ("tensor-core", "lpddr", "launch-arm")),
)
_LINK_ROWS = (("nvlink", 0.8, "nvlink"), ("pcie3", 0.8, "pcie"), ("pcie4", 0.8, "pcie"),
              ("pcie5", 0.8, "pcie"), ("ib-edr", 0.9, "infiniband"),
              ("ib-hdr", 0.9, "infiniband"), ("ib-ndr", 0.9, "infiniband"),
              ("ethernet", 0.7, "ethernet"), ("unified", 0.7, "unified"),
              ("memcpy", 1.0, "measured"), ("loopback", 1.0, "measured"))
_FIGURES = ("compute_efficiency", "memory_efficiency", "launch_overhead")

EFFICIENCY: tuple[Efficiency, ...] = (
    *(_row(name, figure, value, src)
      for names, *values, srcs in _GPU_ROWS for name in names
      for figure, value, src in zip(_FIGURES, values, srcs)),
    *(_row(kind, "efficiency", value, src) for kind, value, src in _LINK_ROWS),
    *(_row("cpu", figure, 1.0, "measured") for figure in _FIGURES[:2]),
    _row("cpu", "cpu_adam_rate", 1.0e9, "cpu-adam"),
    *(_row("cpu", figure, 1.0, "cpu-step")
      for figure in ("backward_flops", "small_flops", "small_backward_flops", "kernel_flops",
                     "elementwise_bandwidth", "op_overhead", "backward_op_overhead",
                     "optimizer_overhead", "offload_bandwidth", "hook_overhead")),
    _row("cpu", "compress_rate", 1.0, "cpu-compress"),
    _row("cpu", "compress_call_overhead", 1.0, "cpu-compress"),
)
"""Every efficiency constant of the time model (see the module doc)."""

_BY_KEY = {(e.applies_to, e.figure): e.value for e in EFFICIENCY}


def efficiency(applies_to: str, figure: str) -> float:
    """The value of one row of :data:`EFFICIENCY`.

    >>> efficiency("pcie3", "efficiency")
    0.8
    """
    try:
        return _BY_KEY[(applies_to, figure)]
    except KeyError:
        known = sorted({e.applies_to for e in EFFICIENCY if e.figure == figure})
        raise KeyError(f"no {figure!r} for {applies_to!r} in the efficiency table; it has one "
                       f"for {known}") from None


def table() -> pd.DataFrame:
    """:data:`EFFICIENCY` as a DataFrame (columns ``applies_to``, ``figure``, ``value``,
    ``source``, ``basis``)."""
    return pd.DataFrame(EFFICIENCY, columns=list(Efficiency._fields))
