"""``Cluster.local()``: this machine's CPU as a device, its figures measured here.

A short micro-benchmark (a few seconds; :func:`measure`) times, with every thread and with one
(``torchrun`` starts each of several processes with ``OMP_NUM_THREADS=1``):

* ``matmul_flops`` — a square fp32 matrix product, FLOP/s;
* ``conv_flops`` — a 3x3 fp32 convolution, FLOP/s;
* ``copy_bandwidth`` — a large tensor copy, bytes read + written per second (what the time
  model's ``bytes_moved`` counts);
* ``launch_overhead`` — seconds per tiny eager op (dispatch);
* ``allreduce`` — gloo all-reduce between 2 processes of this machine: ``bandwidth`` and
  ``latency`` fitted to the ring formula ``2(n-1)/n · S/B + 2(n-1) · latency``.

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

>>> c = local_cluster(EXAMPLE_FIGURES, processes=2)
>>> c.devices[["model", "figures"]].values.tolist()
[['local-cpu', 'measured'], ['local-cpu', 'measured']]
>>> round(c.ring_bandwidth(["cpu0", "cpu1"]) / 1e9, 2)
1.5
"""
from __future__ import annotations

import datetime as _dt
import os
import platform
import socket
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from .._jsonio import read_json, write_json
from ..errors import ClusterError
from .cluster import Cluster

__all__ = ["local", "local_cluster", "measure", "threads_per_process", "cache_dir", "cache_file",
           "FORMAT", "EXAMPLE_FIGURES", "SIZES"]

FORMAT = "memflow.local/1"
CACHE_ENV = "MEMFLOW_CACHE_DIR"

# problem sizes: "default" takes a few seconds, "tiny" (tests) well under one; each size is
# (matmul n, conv (batch, channels, side), copy bytes, all-reduce bytes, repetitions,
# seconds each figure is timed over at least)
SIZES: dict[str, tuple[int, tuple[int, int, int], int, int, int, float]] = {
    "default": (512, (8, 64, 28), 64 * 2**20, 8 * 2**20, 7, 0.4),
    "tiny": (64, (1, 8, 8), 2**20, 2**16, 3, 0.0),
}

EXAMPLE_FIGURES: dict[str, Any] = {
    "format": FORMAT, "host": "example", "cpu": "example CPU", "cores": 2, "threads": 2,
    "memory_bytes": 16 * 2**30, "torch": "2.x", "measured_at": "2026-01-01T00:00:00+00:00",
    "size": "default",
    "matmul_flops": {"all": 60e9, "one": 32e9}, "conv_flops": {"all": 40e9, "one": 22e9},
    "copy_bandwidth": {"all": 12e9, "one": 9e9}, "launch_overhead": 4e-6,
    "allreduce": {"processes": 2, "bandwidth": 1.5e9, "latency": 6e-5},
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


def _seconds_per_call(fn: Callable[[], Any], reps: int, window: float) -> float:
    """Mean seconds per call over ``reps`` calls and at least ``window`` seconds. A mean over
    a window, not a median of short calls: on a shared machine a call shorter than the
    scheduler's time slice runs at the full speed of a core that a longer job only gets its
    share of, so medians of short calls overstate what a training step will see."""
    fn()                                   # warm-up: first-touch pages, kernel selection
    calls, t0 = 0, time.perf_counter()
    while calls < reps or time.perf_counter() - t0 < window:
        fn()
        calls += 1
    return (time.perf_counter() - t0) / calls


def _rates(size: str, threads: int) -> dict[str, float]:
    import torch

    n, (batch, ch, side), copy_bytes, _, reps, window = SIZES[size]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = torch.randn(n, n), torch.randn(n, n)
        x, w = torch.randn(batch, ch, side, side), torch.randn(ch, ch, 3, 3)
        src = torch.ones(copy_bytes // 4)
        dst = torch.empty_like(src)
        conv_flops = 2 * batch * ch * ch * 9 * side * side
        with torch.no_grad():
            return {
                "matmul_flops": 2 * n ** 3 / _seconds_per_call(lambda: torch.mm(a, b), reps,
                                                               window),
                "conv_flops": conv_flops / _seconds_per_call(
                    lambda: torch.nn.functional.conv2d(x, w, padding=1), reps, window),
                "copy_bandwidth": 2 * copy_bytes / _seconds_per_call(lambda: dst.copy_(src),
                                                                     reps, window),
            }
    finally:
        torch.set_num_threads(before)


def _launch_overhead(reps: int, window: float) -> float:
    import torch

    x, y = torch.ones(16), torch.ones(16)
    out = torch.empty(16)

    def many() -> None:
        for _ in range(reps):
            torch.add(x, y, out=out)
    return _seconds_per_call(many, 3, window) / reps


def _allreduce_rank(rank: int, port: int, nbytes: int, reps: int, folder: str) -> None:
    # one rank of the all-reduce benchmark (spawned: module level so it pickles by name)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    try:
        small, large = torch.ones(1), torch.ones(nbytes // 4)
        t_small = _seconds_per_call(lambda: dist.all_reduce(small), 4 * reps, 0.0)
        t_large = _seconds_per_call(lambda: dist.all_reduce(large), reps, 0.0)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    if rank == 0:
        write_json(Path(folder) / "allreduce.json", {"small": t_small, "large": t_large})


def _allreduce(size: str) -> dict[str, float]:
    import torch.multiprocessing as mp

    _, _, _, nbytes, reps, _ = SIZES[size]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as folder:
        mp.spawn(_allreduce_rank, (port, nbytes, reps, folder), nprocs=2)
        t = read_json(Path(folder) / "allreduce.json")
    # two processes: the ring moves S once (2(n-1)/n = 1) in 2(n-1) = 2 latency-bound steps
    latency = t["small"] / 2
    return {"processes": 2, "latency": latency,
            "bandwidth": nbytes / max(t["large"] - t["small"], 1e-9)}


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def measure(size: str = "default", *, collectives: bool = True) -> dict[str, Any]:
    """Run the micro-benchmark (see the module doc); the figures as a JSON-ready dict.

    ``size`` is ``"default"`` or ``"tiny"`` (for tests); ``collectives=False`` leaves out the
    gloo all-reduce (it starts two processes: seconds).

    >>> f = measure("tiny", collectives=False)
    >>> f["format"], f["matmul_flops"]["all"] > 0, "allreduce" in f
    ('memflow.local/1', True, False)
    """
    import torch

    if size not in SIZES:
        raise ClusterError(f"micro-benchmark size {size!r} is unknown; valid: {list(SIZES)}")
    threads = torch.get_num_threads()
    every, one = _rates(size, threads), _rates(size, 1)
    figures: dict[str, Any] = {
        "format": FORMAT, "host": socket.gethostname(), "cpu": _cpu_name(),
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
        else os.cpu_count() or 1,
        "threads": threads,
        "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
        "torch": torch.__version__, "size": size,
        "measured_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        **{k: {"all": every[k], "one": one[k]} for k in every},
        "launch_overhead": _launch_overhead(200 if size == "tiny" else 2000, SIZES[size][-1]),
    }
    if collectives:
        figures["allreduce"] = _allreduce(size)
    return figures


def threads_per_process(processes: int) -> int | None:
    """Threads each of ``processes`` new processes will run: ``OMP_NUM_THREADS`` when set,
    else 1 for several (``torchrun`` sets it so), else None (every thread)."""
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) >= 1:
        return int(env)
    return 1 if processes > 1 else None


def _rates_of(figures: dict[str, Any], processes: int, threads: int | None) -> tuple[float, ...]:
    """(matmul, conv, copy) rates of one of ``processes`` concurrent processes. Every thread
    of one process: the all-thread figures. One thread each: the one-thread figures, compute
    shared when there are more processes than cores, memory bandwidth shared over all of
    them (the machine's total is the all-thread copy rate)."""
    if threads is None or (threads > 1 and processes == 1):
        return tuple(figures[k]["all"] for k in ("matmul_flops", "conv_flops", "copy_bandwidth"))
    share = min(1.0, int(figures["cores"]) / (processes * threads))
    copy = figures["copy_bandwidth"]
    return (figures["matmul_flops"]["one"] * share, figures["conv_flops"]["one"] * share,
            copy["one"] if processes == 1 else min(copy["one"], copy["all"] / processes))


def local_cluster(figures: dict[str, Any], processes: int = 1,
                  names: list[str] | None = None, threads: int | None = -1) -> Cluster:
    """The cluster of ``processes`` CPU devices that ``figures`` (from :func:`measure`)
    describe (see the module doc); ``names`` renames the devices (to run a strategy made
    for other device names here); ``threads`` per process (None: every thread; default:
    :func:`threads_per_process`)."""
    n = int(processes)
    threads = threads_per_process(n) if threads == -1 else threads
    if n < 1:
        raise ClusterError(f"processes must be >= 1, got {processes}")
    if n > 1 and "allreduce" not in figures:
        raise ClusterError(f"{n} processes need the gloo all-reduce figures; measure with "
                           "collectives=True (Cluster.local(remeasure=True))")
    matmul, conv, copy = _rates_of(figures, n, threads)
    peak = max(matmul, conv)
    if names is not None and len(names) != n:
        raise ClusterError(f"{n} processes need {n} device names, got {list(names)}")
    names = list(names) if names is not None else [f"cpu{i}" for i in range(n)]
    hosts = [f"host{i}" for i in range(n)]
    share = float(figures["memory_bytes"]) / n
    devices = pd.DataFrame({
        "device": names, "node": range(n), "model": "local-cpu", "memory_bytes": share,
        "peak_flops_fp32": peak, "peak_flops_fp16": np.nan, "mem_bandwidth": copy,
        # a layer is a GEMM or a convolution: the mean of the two achieved rates
        "compute_efficiency": (matmul + conv) / 2 / peak, "memory_efficiency": 1.0,
        "launch_overhead": float(figures["launch_overhead"]), "host": hosts,
        "figures": "measured"})
    links = [(d, h, "memcpy", copy / 2, np.nan) for d, h in zip(names, hosts)]
    links += [(h, d, "memcpy", copy / 2, np.nan) for d, h in zip(names, hosts)]
    switches = None
    if n > 1:
        ar = figures["allreduce"]
        # a ring hop crosses two loopback links (host -> switch -> host) and two memcpy ones
        hop = max(float(ar["latency"]) - 2e-6, 0.0) / 2
        links += [(h, "loopback", "loopback", float(ar["bandwidth"]), hop) for h in hosts]
        links += [("loopback", h, "loopback", float(ar["bandwidth"]), hop) for h in hosts]
        switches = pd.DataFrame({"switch": ["loopback"], "node": [-1], "kind": ["network"]})
    return Cluster(devices, pd.DataFrame({"host": hosts, "node": range(n), "memory_bytes": share}),
                   pd.DataFrame(links, columns=["src", "dst", "kind", "bandwidth", "latency"]),
                   switches, name=f"{n}xlocal-cpu")


def local(processes: int = 1, *, remeasure: bool = False, size: str = "default",
          names: list[str] | None = None) -> Cluster:
    """This machine as a cluster of ``processes`` CPU devices (named ``names``, default
    ``cpu0``, ``cpu1``, …), from cached figures (measured first if there are none, or if
    ``remeasure``). See the module doc.

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
    return local_cluster(figures, processes, names)


def _attach() -> None:
    # Cluster.local(), where users look for it (it builds a cluster: it sits above cluster.py)
    Cluster.local = staticmethod(local)


_attach()
