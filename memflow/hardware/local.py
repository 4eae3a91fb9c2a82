"""``Cluster.local()``: this machine's CPU as a device, its figures measured here.

A short micro-benchmark (a few seconds; :func:`~memflow.hardware.microbench.measure`) times
this machine's CPU: matrix product and convolution FLOP/s, copy bandwidth, dispatch, the CPU
step's other costs (:data:`~memflow.hardware.microbench.STEP_FIGURES`), the shape-class rate
table of matrix products and convolutions (:mod:`memflow.hardware.kernels`) and the gloo
all-reduce between two processes.

Each one-thread figure is timed by two clocks: the wall clock (``one``) and the process's CPU
time (``cpu``). The CPU time of a one-thread process moves less with the other jobs' load on
a shared machine than its wall time does: ``local_cluster(..., clock="cpu")`` predicts the
CPU time of a one-process step, which :func:`memflow.export.timing.step_time` measures the
same way.

The figures are cached as JSON in :func:`cache_dir` (``$MEMFLOW_CACHE_DIR``, else
``$XDG_CACHE_HOME/memflow``, else ``~/.cache/memflow``), one file per host name, and measured
again with ``remeasure=True``. :func:`local_cluster` turns them into a cluster of
``processes`` CPU devices (``cpu0``, ``cpu1``, …), one per node so that the processes meet
over a ``loopback`` link (gloo's TCP) and each offloads to its own host over a ``memcpy`` link.
One process runs every thread (unless ``OMP_NUM_THREADS`` says otherwise); several get one
thread each (``torchrun``'s default) and their share of the cores and of the memory
bandwidth (:func:`threads_per_process`). On a loaded machine one thread can beat two: the
threads of an OpenMP kernel wait for each other, and a busy core makes them all wait, which
is why both figures are measured. The devices' ``figures`` column says ``measured``.

The share of the cores is this session's (:func:`thread_cores`): Linux shares a busy
machine between sessions before it shares a session's part between its threads, so the
measured ``session_cores`` (the cores one busy thread per core got together) is split
between every thread of the processes, and the one-thread figures, timed at
``min(1, session_cores)`` of a core, are scaled to what each thread gets. gloo's all-reduce
is CPU work too: its loopback bandwidth follows the same share (measured at two processes,
at its own ``session_cores``), and where no core is left over for gloo's thread (the device
column ``collective_overlap`` below 1) a DDP all-reduce cannot run beside the backward:
:mod:`memflow.sim.durations` charges that part of it on the processes' compute.

>>> c = local_cluster(EXAMPLE_FIGURES, processes=2)
>>> c.devices[["model", "figures"]].values.tolist()
[['local-cpu', 'measured'], ['local-cpu', 'measured']]
>>> round(c.ring_bandwidth(["cpu0", "cpu1"]) / 1e9, 2)
1.5
"""
from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .._jsonio import read_json, write_json
from ..errors import ClusterError
from .cluster import Cluster
from .microbench import FORMAT, SIZES, SIZES_SMALL, STEP_FIGURES, measure

__all__ = ["local", "local_cluster", "measure", "threads_per_process", "thread_cores",
           "collective_overlap", "cache_dir", "cache_file", "FORMAT", "EXAMPLE_FIGURES", "SIZES",
           "STEP_FIGURES"]

CACHE_ENV = "MEMFLOW_CACHE_DIR"

EXAMPLE_FIGURES: dict[str, Any] = {
    "format": FORMAT, "host": "example", "cpu": "example CPU", "cores": 2, "threads": 2,
    "memory_bytes": 16 * 2**30, "torch": "2.x", "measured_at": "2026-01-01T00:00:00+00:00",
    "size": "default",
    "matmul_flops": {"all": 60e9, "one": 32e9, "cpu": 34e9},
    "conv_flops": {"all": 40e9, "one": 22e9, "cpu": 24e9},
    "copy_bandwidth": {"all": 12e9, "one": 9e9, "cpu": 10e9}, "launch_overhead": 4e-6,
    "matmul_backward_flops": {"one": 28e9, "cpu": 30e9},
    "conv_backward_flops": {"one": 18e9, "cpu": 20e9},
    "small_matmul_flops": {"one": 16e9, "cpu": 17e9},
    "small_conv_flops": {"one": 8e9, "cpu": 9e9},
    "small_matmul_backward_flops": {"one": 6e9, "cpu": 7e9},
    "small_conv_backward_flops": {"one": 5e9, "cpu": 6e9},
    "elementwise_bandwidth": {"one": 30e9, "cpu": 32e9},
    "op_overhead": {"one": 4e-6, "cpu": 3.5e-6},
    "backward_op_overhead": {"one": 3e-6, "cpu": 2.5e-6},
    "optimizer_overhead": {"one": 5e-6, "cpu": 4.5e-6},
    "offload_bandwidth": {"one": 3e9, "cpu": 3.2e9},
    "hook_overhead": {"one": 2e-6, "cpu": 1.8e-6},
    "allreduce": {"processes": 2, "bandwidth": 1.5e9, "latency": 6e-5},
    "kernel_rates": {clock: [["matmul", 32, 64, 64, 8e9 * f, 6e9 * f],
                             ["matmul", 512, 512, 512, 32e9 * f, 28e9 * f],
                             ["conv", 128, 16, 144, 6e9 * f, 4e9 * f],
                             ["conv", 2048, 128, 1152, 22e9 * f, 18e9 * f],
                             ["conv1x1", 32, 256, 256, 5e9 * f, 4e9 * f],
                             ["conv1x1", 2048, 256, 256, 20e9 * f, 16e9 * f]]
                     for clock, f in (("one", 1.0), ("cpu", 1.1))},
}
"""Figures of the shape :func:`measure` returns (for examples and tests)."""


def cache_dir() -> Path:
    """The folder of memflow's cached measurements (see the module doc).

    >>> import os
    >>> os.environ["MEMFLOW_CACHE_DIR"] = "/tmp/mf-cache"; str(cache_dir())
    '/tmp/mf-cache'
    >>> del os.environ["MEMFLOW_CACHE_DIR"]
    """
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "memflow"


def cache_file() -> Path:
    """This machine's cached figures: ``local-<host name>.json`` in :func:`cache_dir`."""
    host = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in socket.gethostname())
    return cache_dir() / f"local-{host or 'machine'}.json"


def threads_per_process(processes: int) -> int | None:
    """Threads each of ``processes`` new processes will run: ``OMP_NUM_THREADS`` when set,
    else 1 for several (``torchrun`` sets it so), else None (every thread)."""
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) >= 1:
        return int(env)
    return 1 if processes > 1 else None


def _session(figures: dict[str, Any]) -> float:
    # figures measured without it (memflow.local/5 and the examples): every core
    return float(figures.get("session_cores", figures["cores"]))


def thread_cores(figures: dict[str, Any], processes: int = 1, threads: int = 1) -> float:
    """The cores each thread of ``processes`` processes of ``threads`` threads gets: this
    session's measured cores (``session_cores``; the machine's ``cores`` in figures without
    it) split between all of them, at most one (module doc).

    >>> loaded, idle = {"cores": 2, "session_cores": 0.5}, {"cores": 2}
    >>> thread_cores(loaded), thread_cores(loaded, 2), thread_cores(idle, 2), thread_cores(idle, 4)
    (0.5, 0.25, 1.0, 0.5)
    """
    return min(1.0, _session(figures) / (processes * threads))


def collective_overlap(figures: dict[str, Any], processes: int, threads: int = 1) -> float:
    """The part of a gloo all-reduce that runs beside the processes' compute: each process's
    gloo thread needs a core that the compute threads leave free in this session's cores
    (0 where they fill them: the all-reduce's copies and sums then take the compute's
    turn on the cores)."""
    return float(np.clip((_session(figures) - processes * threads) / processes, 0.0, 1.0))


def _rates_of(figures: dict[str, Any], processes: int, threads: int | None,
              clock: str = "wall") -> dict[str, float]:
    """The rates of one of ``processes`` concurrent processes: matmul, conv, copy and the
    :data:`STEP_FIGURES`. Every thread of one process: the all-thread figures (the step
    figures are one thread's). One thread each: the one-thread figures scaled from the
    cores one thread got when they were timed to what each thread gets now
    (:func:`thread_cores`), memory bandwidth shared over all of them (the machine's total is
    the all-thread copy rate). ``clock="cpu"``: one process's one-thread figures timed by
    CPU time. ``kernel_rates``: the shape-class rate table (one thread's, shared as the step
    figures are)."""
    main = ("matmul_flops", "conv_flops", "copy_bandwidth")
    table = figures["kernel_rates"]["cpu" if clock == "cpu" else "one"]
    if clock == "cpu":
        return {k: figures[k]["cpu"] for k in (*main, *STEP_FIGURES)} | {"kernel_rates": table}
    step = {k: figures[k]["one"] for k in STEP_FIGURES}
    if threads is None or (threads > 1 and processes == 1):
        return {**{k: figures[k]["all"] for k in main}, **step, "kernel_rates": table}
    share = thread_cores(figures, processes, threads) / thread_cores(figures)
    copy = figures["copy_bandwidth"]
    # sharing a core: rates shrink, seconds per op grow, by the share
    return {"matmul_flops": figures["matmul_flops"]["one"] * share,
            "conv_flops": figures["conv_flops"]["one"] * share,
            "copy_bandwidth": copy["one"] if processes == 1 else min(copy["one"],
                                                                   copy["all"] / processes),
            **{k: v / share if k.endswith("overhead") else v * share for k, v in step.items()},
            "kernel_rates": [[*row[:4], row[4] * share, row[5] * share] for row in table]}


def _op_flops(size: str) -> dict[str, float]:
    """FLOPs per op of the large and the small kernels (geometric mean of the matrix
    product's and the convolution's; the small convolution's, of its 3x3 and 1x1 ones): where
    the time model places their rates."""
    n, (batch, ch, side) = SIZES[size][0], SIZES[size][1]
    m, (sb, sc, ss), (ob, oc, os_) = SIZES_SMALL[size]
    small_conv = np.sqrt(2 * sb * sc * sc * 9 * ss * ss * 2 * ob * oc * oc * os_ * os_)
    return {"large_op_flops": float(np.sqrt(2 * n ** 3 * 2 * batch * ch * ch * 9 * side * side)),
            "small_op_flops": float(np.sqrt(2 * m ** 3 * small_conv))}


def local_cluster(figures: dict[str, Any], processes: int = 1,
                  names: list[str] | None = None, threads: int | None = -1,
                  clock: str = "wall") -> Cluster:
    """The cluster of ``processes`` CPU devices that ``figures`` (from :func:`measure`)
    describe (see the module doc); ``names`` renames the devices (to run a strategy made
    for other device names here); ``threads`` per process (None: every thread; default:
    :func:`threads_per_process`); ``clock`` ``"wall"`` or ``"cpu"`` (one process, one
    thread: its rates timed by CPU time, to predict a step's CPU time).

    Besides the catalogue's columns, the devices carry the CPU step's figures
    (:data:`STEP_FIGURES`; ``backward_flops`` the mean of the two backward rates) and the
    shape-class rate table (``kernel_rates``, JSON text of its rows;
    :mod:`memflow.hardware.kernels`), which :mod:`memflow.sim.cpu_time` charges on CPU devices
    only."""
    n = int(processes)
    threads = threads_per_process(n) if threads == -1 else threads
    if n < 1:
        raise ClusterError(f"processes must be >= 1, got {processes}")
    if clock not in ("wall", "cpu") or (clock == "cpu" and (n > 1 or (threads or 2) > 1)):
        raise ClusterError(f"clock {clock!r} with {n} process(es) of {threads or 'every'} "
                           "thread(s): valid are 'wall', and 'cpu' for one process of one "
                           "thread (several processes wait for each other: wall time)")
    if n > 1 and "allreduce" not in figures:
        raise ClusterError(f"{n} processes need the gloo all-reduce figures; measure with "
                           "collectives=True (Cluster.local(remeasure=True))")
    r = _rates_of(figures, n, threads, clock)
    matmul, conv, copy = r["matmul_flops"], r["conv_flops"], r["copy_bandwidth"]
    peak = max(matmul, conv)
    if names is not None and len(names) != n:
        raise ClusterError(f"{n} processes need {n} device names, got {list(names)}")
    names = list(names) if names is not None else [f"cpu{i}" for i in range(n)]
    hosts = [f"host{i}" for i in range(n)]
    share = float(figures["memory_bytes"]) / n
    devices = pd.DataFrame({
        "device": names, "node": range(n), "model": "local-cpu", "memory_bytes": share,
        "peak_flops_fp32": peak, "peak_flops_fp16": np.nan, "mem_bandwidth": copy,
        # PyTorch runs bf16 natively on a CPU (oneDNN), at no more than the FP32 rate that
        # every dtype is charged here: the search may propose it for the memory it saves
        "bf16": True,
        # a layer is a GEMM or a convolution: the mean of the two achieved rates
        "compute_efficiency": (matmul + conv) / 2 / peak, "memory_efficiency": 1.0,
        "launch_overhead": r["op_overhead"], "host": hosts,
        "figures": "measured", "clock": clock,
        "backward_flops": (r["matmul_backward_flops"] + r["conv_backward_flops"]) / 2,
        "small_flops": (r["small_matmul_flops"] + r["small_conv_flops"]) / 2,
        "small_backward_flops": (r["small_matmul_backward_flops"]
                                 + r["small_conv_backward_flops"]) / 2,
        **_op_flops(figures.get("size", "default")),
        **{k: r[k] for k in STEP_FIGURES[6:]},
        "collective_overlap": collective_overlap(figures, n, threads or 1) if n > 1 else 1.0,
        # the shape-class rate table (memflow.hardware.kernels) as JSON text: one cell
        "kernel_rates": json.dumps(r["kernel_rates"])})
    links = [(d, h, "memcpy", copy / 2, np.nan) for d, h in zip(names, hosts)]
    links += [(h, d, "memcpy", copy / 2, np.nan) for d, h in zip(names, hosts)]
    switches = None
    if n > 1:
        ar = figures["allreduce"]
        # a ring hop crosses two loopback links (host -> switch -> host) and two memcpy ones
        hop = max(float(ar["latency"]) - 2e-6, 0.0) / 2
        # gloo copies and sums on the processes' CPU: its bandwidth at the cores each of
        # them gets now over what each of the two measuring processes got (4 processes on
        # the 2-core development machine took 2.6 times 2's seconds per ring byte)
        then = {"cores": figures["cores"],
                "session_cores": ar.get("session_cores", _session(figures))}
        wire = float(ar["bandwidth"]) * thread_cores(figures, n, threads or 1) / thread_cores(
            then, 2)
        links += [(h, "loopback", "loopback", wire, hop) for h in hosts]
        links += [("loopback", h, "loopback", wire, hop) for h in hosts]
        switches = pd.DataFrame({"switch": ["loopback"], "node": [-1], "kind": ["network"]})
    return Cluster(devices, pd.DataFrame({"host": hosts, "node": range(n), "memory_bytes": share}),
                   pd.DataFrame(links, columns=["src", "dst", "kind", "bandwidth", "latency"]),
                   switches, name=f"{n}xlocal-cpu")


def local(processes: int = 1, *, remeasure: bool = False, size: str = "default",
          names: list[str] | None = None, clock: str = "wall") -> Cluster:
    """This machine as a cluster of ``processes`` CPU devices (named ``names``, default
    ``cpu0``, ``cpu1``, …), from cached figures (measured first if there are none, or if
    ``remeasure``); ``clock`` as in :func:`local_cluster`. See the module doc.

    >>> import os, tempfile
    >>> os.environ["MEMFLOW_CACHE_DIR"] = tempfile.mkdtemp()
    >>> from memflow._jsonio import write_json
    >>> _ = write_json(cache_file(), EXAMPLE_FIGURES)
    >>> Cluster.local(2).devices.index.tolist()
    ['cpu0', 'cpu1']
    >>> del os.environ["MEMFLOW_CACHE_DIR"]
    """
    path = cache_file()
    figures = None
    if path.is_file() and not remeasure:
        figures = read_json(path, kind="memflow.local/")
        if figures["format"] != FORMAT:
            figures = None      # another layout: measure again rather than misread it
    if figures is None:
        figures = measure(size)
        write_json(path, figures)
    return local_cluster(figures, processes, names, clock=clock)


def _attach() -> None:
    # Cluster.local(), where users look for it (it builds a cluster: it sits above cluster.py)
    Cluster.local = staticmethod(local)


_attach()
