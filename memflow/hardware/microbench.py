"""The micro-benchmark behind ``Cluster.local()``: this machine's CPU, measured in seconds.

:func:`measure` times, with every thread and with one (``torchrun`` starts each of several
processes with ``OMP_NUM_THREADS=1``):

* ``matmul_flops`` — a square fp32 matrix product, FLOP/s;
* ``conv_flops`` — a 3x3 fp32 convolution, FLOP/s;
* ``copy_bandwidth`` — a large tensor copy, bytes read + written per second (what the time
  model's ``bytes_moved`` counts);
* ``launch_overhead`` — seconds per tiny eager op (dispatch);
* the CPU step's other costs (:data:`STEP_FIGURES`, one thread): the backward rates of the
  matrix product and the convolution (their backward does twice the forward's FLOPs, at its
  own rate; timed on the aten kernels, without autograd), the same four rates on small
  kernels (a CPU kernel's rate falls with its size; the small convolution is a 3x3 and a 1x1
  one), every kernel cycling through :data:`~.kernels.OPERAND_SETS` operand sets as a
  model's layers do,
  the bandwidth of a mix of memory-bound training ops (normalisations, activations, a
  residual add, a softmax: forward and backward), the dispatch and autograd overhead per op
  recorded in forward and per node run in backward, the optimizer's overhead per parameter
  tensor, and what an offloading unit's hooks cost (bytes per second into new host images,
  seconds per saved tensor of the Python pack and unpack hooks);
* ``kernel_rates`` — the shape-class rate table (:mod:`memflow.hardware.kernels`): forward and
  backward FLOP/s of a small grid of matrix-product (as ``nn.Linear`` runs them) and
  convolution shapes, one thread, each kernel after an L2 cache's worth of other traffic;
* ``session_cores`` — the cores this session's processes get together when it runs one busy
  thread per core (CPU time over wall time): Linux shares a busy machine between sessions
  (``sched_autogroup``) before it shares a session's share between its threads, so on a
  machine loaded by other sessions' jobs, several processes of one session split what one
  of them gets alone (measured on the 2-core development machine: 0.49 cores with one busy
  thread, 0.46 with two; two one-process training steps at once each took twice one's wall
  time);
* ``allreduce`` — gloo all-reduce between 2 processes of this machine: ``bandwidth`` and
  ``latency`` fitted to the ring formula ``2(n-1)/n · S/B + 2(n-1) · latency``, and the
  ``session_cores`` it was measured at (gloo's loopback all-reduce is CPU work: its
  bandwidth follows the processes' share of the cores).

Each one-thread figure is timed by two clocks: the wall clock (``one``) and the process's CPU
time (``cpu``): see :mod:`memflow.hardware.local`.
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

from .._jsonio import read_json, write_json
from ..errors import ClusterError
from .kernels import Kernel, conv_kernel, evictor, matmul_kernel, measure_grid

__all__ = ["measure", "FORMAT", "SIZES", "SIZES_SMALL", "STEP_FIGURES"]

FORMAT = "memflow.local/6"

# problem sizes: "default" takes a few seconds, "tiny" (tests) well under one; each size is
# (matmul n, conv (batch, channels, side), copy bytes, all-reduce bytes, repetitions,
# seconds each figure is timed over at least)
SIZES: dict[str, tuple[int, tuple[int, int, int], int, int, int, float]] = {
    "default": (512, (8, 64, 28), 64 * 2**20, 8 * 2**20, 7, 0.4),
    "tiny": (64, (1, 8, 8), 2**20, 2**16, 3, 0.0),
}
# the step figures' sizes: elements of the element-wise op's tensors (an activation: in
# cache), tiny ops in the dispatch chain (and parameter tensors of the optimizer step)
SIZES_STEP: dict[str, tuple[int, int]] = {"default": (2**18, 200), "tiny": (2**12, 20)}
# the small kernels' sizes: matmul m (m x m by m x m), conv (batch, channels, side) of a
# 3x3 and of a 1x1 convolution
SIZES_SMALL: dict[str, tuple[int, tuple[int, int, int], tuple[int, int, int]]] = {
    "default": (128, (8, 16, 16), (8, 32, 16)), "tiny": (16, (1, 4, 4), (1, 8, 4))}
STEP_FIGURES = ("matmul_backward_flops", "conv_backward_flops", "small_matmul_flops",
                "small_conv_flops", "small_matmul_backward_flops", "small_conv_backward_flops",
                "elementwise_bandwidth", "op_overhead", "backward_op_overhead",
                "optimizer_overhead", "offload_bandwidth", "hook_overhead")
"""The figures of a CPU step's costs besides forward matmul and convolution (module doc)."""


def _seconds_per_call(fn: Callable[[], Any], reps: int, window: float) -> tuple[float, float]:
    """Mean wall and CPU seconds per call over ``reps`` calls and at least ``window`` seconds
    of CPU time. A mean over a window, not a median of short calls: on a shared machine a call
    shorter than the scheduler's time slice runs at the full speed of a core that a longer job
    only gets its share of, so medians of short calls overstate what a training step will see.
    The CPU time (``time.process_time``) counts only what this process ran."""
    fn()                                   # warm-up: first-touch pages, kernel selection
    calls, t0, c0 = 0, time.perf_counter(), time.process_time()
    while calls < reps or time.process_time() - c0 < window:
        fn()
        calls += 1
    return (time.perf_counter() - t0) / calls, (time.process_time() - c0) / calls


def _kernels(n: int, convs: tuple[tuple[int, int, int, int], ...]) -> dict[str, Kernel]:
    """FLOPs, forward call and backward call of an ``n``-square matrix product
    (``matmul``) and of each convolution of ``convs`` = ((batch, channels, side, kernel),
    …) (``conv``, ``conv1``, …), their operands cycling (:func:`~.kernels.cycling`). The
    backward calls the aten kernels autograd runs without autograd, whose per-node cost is a
    figure of its own (``backward_op_overhead``)."""
    return {"matmul": matmul_kernel(n, n, n),
            **{"conv" + (str(i) if i else ""): conv_kernel(*conv) for i, conv in enumerate(convs)}}


def _rates(size: str, threads: int) -> dict[str, tuple[float, float]]:
    """(wall, CPU-time) rate of matmul, convolution and copy with ``threads`` threads."""
    import torch

    n, conv, copy_bytes, _, reps, window = SIZES[size]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        src = torch.ones(copy_bytes // 4)
        dst = torch.empty_like(src)
        work = {f"{k}_flops": (flops, fwd)
                for k, (flops, fwd, _) in _kernels(n, ((*conv, 3),)).items()}
        work["copy_bandwidth"] = (2 * copy_bytes, lambda: dst.copy_(src))
        with torch.no_grad():
            return {k: _per_second(amount, _seconds_per_call(fn, reps, window))
                    for k, (amount, fn) in work.items()}
    finally:
        torch.set_num_threads(before)


def _per_second(amount: float, seconds: tuple[float, float]) -> tuple[float, float]:
    return amount / seconds[0], amount / seconds[1]


def _per_op(seconds: tuple[float, float], ops: int) -> tuple[float, float]:
    return seconds[0] / ops, seconds[1] / ops


def _backward_seconds(step: Callable[[], Any], forward: Callable[[], Any], reps: int,
                      window: float) -> tuple[float, float]:
    """(wall, CPU) seconds of a backward alone (autograd's, for its per-node cost): forward
    and backward, less the forward."""
    both, fwd = _seconds_per_call(step, reps, window), _seconds_per_call(forward, reps, window)
    return max(both[0] - fwd[0], 1e-12), max(both[1] - fwd[1], 1e-12)


def _step_figures(size: str) -> dict[str, tuple[float, float]]:
    """(wall, CPU-time) figures of :data:`STEP_FIGURES`, one thread (see the module doc)."""
    import torch

    n, conv, _, _, reps, window = SIZES[size]
    elements, chain = SIZES_STEP[size]
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tiny = torch.ones(4, requires_grad=True)
        params = [torch.nn.Parameter(torch.ones(4)) for _ in range(chain)]
        for p in params:
            p.grad = torch.ones(4)
        sgd = torch.optim.SGD(params, lr=1e-3)

        def ops() -> Any:
            y = tiny
            for _ in range(chain):
                y = y * 1.0
            return y
        return {
            **{f"{k}_backward_flops": _per_second(2 * flops,
                                                  _seconds_per_call(back, reps, window))
               for k, (flops, _, back) in _kernels(n, ((*conv, 3),)).items()},
            "elementwise_bandwidth": _per_second(*_memory_bound_mix(elements, reps, window)),
            **_small_kernels(size, reps, window),
            "op_overhead": _per_op(_seconds_per_call(ops, reps, window), chain),
            "backward_op_overhead": _per_op(_backward_seconds(
                lambda: ops().sum().backward(), lambda: ops().sum(), reps, window), chain),
            "optimizer_overhead": _per_op(_seconds_per_call(sgd.step, reps, window), chain),
            "offload_bandwidth": _per_second(*_offload(elements, reps, window)),
            "hook_overhead": _per_op(_hooked(tiny, chain, reps, window), chain),
        }
    finally:
        torch.set_num_threads(before)


def _small_kernels(size: str, reps: int, window: float) -> dict[str, tuple[float, float]]:
    """Forward and backward FLOP/s of a small matrix product and convolution (the kernels of
    a small model; :data:`SIZES_SMALL`): a CPU kernel's rate falls with its size, and the
    time model interpolates between these and the large ones. The convolution's rate is the
    mean of a 3x3 and a 1x1 one (the bottleneck block's kernels: on one thread and a batch
    under 16 PyTorch runs a 1x1 convolution as a matrix product, at its own rate); the graph
    does not tell a unit's kernels apart, so one figure stands for both."""
    import torch

    m, (batch, ch, side), (batch1, ch1, side1) = SIZES_SMALL[size]
    kernels = _kernels(m, ((batch, ch, side, 3), (batch1, ch1, side1, 1)))
    with torch.no_grad():
        rates = {k: (_per_second(flops, _seconds_per_call(fwd, reps, window)),
                     _per_second(2 * flops, _seconds_per_call(back, reps, window)))
                 for k, (flops, fwd, back) in kernels.items()}
    conv = [tuple(sum(r[j][c] for k, r in rates.items() if k != "matmul") / 2
                  for c in (0, 1)) for j in (0, 1)]
    return {"small_matmul_flops": rates["matmul"][0],
            "small_matmul_backward_flops": rates["matmul"][1],
            "small_conv_flops": conv[0], "small_conv_backward_flops": conv[1]}


def _kernel_rates(size: str) -> dict[str, list[list]]:
    """The shape-class rate table (:mod:`memflow.hardware.kernels`), one thread."""
    import torch

    _, _, _, _, reps, window = SIZES[size]
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        # each kernel after an L2's worth of other traffic, as in a step (kernels module doc)
        return measure_grid(size, lambda call: _seconds_per_call(call, reps, window),
                            evictor())
    finally:
        torch.set_num_threads(before)


def _memory_bound_mix(elements: int, reps: int, window: float) -> tuple[float, tuple]:
    """Bytes (inputs + outputs of each op, as the graph counts them) and (wall, CPU) seconds
    of a mix of the memory-bound ops of a training step, forward and backward, on one
    activation-sized map each: a batch norm and a layer norm (training), ReLU, GELU, a
    residual add and a softmax, in equal bytes. Their rates differ by several times on a
    CPU (a normalisation makes three passes), so the mix's rate, not one copy's, is what the
    time model charges for the bytes of ops other than matrix products and convolutions."""
    import torch

    F = torch.nn.functional
    x = torch.randn(8, 32, elements // 256, 8, requires_grad=True)     # N, C, H, W
    r = torch.randn(x.shape)
    g = torch.ones(32, requires_grad=True)
    t = torch.randn(elements // 64, 64, requires_grad=True)         # tokens x hidden
    gl = torch.ones(64, requires_grad=True)

    def forward() -> Any:
        return (F.batch_norm(x, None, None, g, g, training=True).sum()
                + F.layer_norm(t, (64,), gl, gl).sum() + F.relu(x).sum() + F.gelu(x).sum()
                + (x + r).sum() + F.softmax(t, -1).sum())
    # bytes each op reads and writes: forward (in + out, weights negligible) and backward
    # (grad out + saved input(s) in, grad in out); a norm's backward reads its input too
    per = x.numel() * 4
    moved = per * (2 + 2 + 2 + 2 + 3 + 2) + per * (3 + 3 + 3 + 3 + 3 + 3)
    both = _seconds_per_call(lambda: forward().backward(), reps, window)
    reduce = _seconds_per_call(lambda: x.sum() + t.sum(), reps, window)   # the sums' own time
    return moved, (max(both[0] - 6 * reduce[0], 1e-12), max(both[1] - 6 * reduce[1], 1e-12))


def _offload(elements: int, reps: int, window: float) -> tuple[float, tuple]:
    """Bytes and (wall, CPU) seconds of copying activation-sized maps into host images made
    for them, as an offloading unit's hook does on a CPU (a new image per map: its first
    touch costs page faults, which a copy into a warm buffer does not)."""
    import torch

    maps = [torch.randn(elements) for _ in range(16)]

    def images() -> None:
        kept = []
        for m in maps:
            kept.append(torch.empty(m.numel() * 4, dtype=torch.uint8).view(torch.float32))
            kept[-1].copy_(m)
    return 16 * elements * 4, _seconds_per_call(images, reps, window)


def _hooked(tiny: Any, chain: int, reps: int, window: float) -> tuple[float, float]:
    """(wall, CPU) seconds of ``chain`` saved tensors' Python pack and unpack hooks
    (``saved_tensors_hooks``, as export's offload and compress units run), beyond the ops."""
    import torch

    def step(hooked: bool) -> None:
        if hooked:
            with torch.autograd.graph.saved_tensors_hooks(lambda t: (t,), lambda p: p[0]):
                y = tiny
                for _ in range(chain):
                    y = y * y              # saves both operands: two packs, two unpacks
        else:
            y = tiny
            for _ in range(chain):
                y = y * y
        y.sum().backward()
    with_hooks = _seconds_per_call(lambda: step(True), reps, window)
    without = _seconds_per_call(lambda: step(False), reps, window)
    # floored as :func:`_backward_seconds` is: under load the difference can come out <= 0
    return (max(with_hooks[0] - without[0], 1e-12) / 2,
            max(with_hooks[1] - without[1], 1e-12) / 2)


def _launch_overhead(reps: int, window: float) -> float:
    import torch

    x, y = torch.ones(16), torch.ones(16)
    out = torch.empty(16)

    def many() -> None:
        for _ in range(reps):
            torch.add(x, y, out=out)
    return _seconds_per_call(many, 3, window)[0] / reps


def _session_cores(cores: int, window: float) -> float:
    """Cores this session's threads get together while it runs ``cores`` busy one-thread
    matrix products at once (threads of this process: torch releases the GIL in a kernel):
    its CPU time over the wall time of ``window / 2`` seconds (at least 0.05; module doc)."""
    import threading

    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    stop = threading.Event()
    a = torch.randn(128, 128)

    def busy() -> None:
        out = torch.empty(128, 128)
        while not stop.is_set():
            torch.mm(a, a, out=out)
    threads = [threading.Thread(target=busy, daemon=True) for _ in range(cores)]
    try:
        t0, c0 = time.perf_counter(), time.process_time()
        for t in threads:
            t.start()
        time.sleep(max(window / 2, 0.05))
        stop.set()
        for t in threads:
            t.join()
        return (time.process_time() - c0) / max(time.perf_counter() - t0, 1e-9)
    finally:
        torch.set_num_threads(before)


def _cores() -> int:
    return (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else os.cpu_count() or 1)


def _allreduce_rank(rank: int, port: int, nbytes: int, reps: int, folder: str) -> None:
    # one rank of the all-reduce benchmark (spawned: module level so it pickles by name)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    try:
        small, large = torch.ones(1), torch.ones(nbytes // 4)
        t_small = _seconds_per_call(lambda: dist.all_reduce(small), 4 * reps, 0.0)[0]
        t_large = _seconds_per_call(lambda: dist.all_reduce(large), reps, 0.0)[0]
        dist.barrier()
    finally:
        dist.destroy_process_group()
    if rank == 0:
        write_json(Path(folder) / "allreduce.json", {"small": t_small, "large": t_large})


def _allreduce(size: str) -> dict[str, float]:
    import torch.multiprocessing as mp

    _, _, _, nbytes, reps, window = SIZES[size]
    before = _session_cores(_cores(), window)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as folder:
        mp.spawn(_allreduce_rank, (port, nbytes, reps, folder), nprocs=2)
        t = read_json(Path(folder) / "allreduce.json")
    # two processes: the ring moves S once (2(n-1)/n = 1) in 2(n-1) = 2 latency-bound steps
    latency = t["small"] / 2
    return {"processes": 2, "latency": latency,
            "bandwidth": nbytes / max(t["large"] - t["small"], 1e-9),
            "session_cores": (before + _session_cores(_cores(), window)) / 2}


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
    ('memflow.local/6', True, False)
    """
    import torch

    if size not in SIZES:
        raise ClusterError(f"micro-benchmark size {size!r} is unknown; valid: {list(SIZES)}")
    threads = torch.get_num_threads()
    window = SIZES[size][-1]
    # the session's cores sampled between the parts (the other sessions' load moves within
    # seconds): their mean is the load the one-thread figures were timed under
    session = [_session_cores(_cores(), window)]
    one = _rates(size, 1)
    every = one if threads == 1 else _rates(size, threads)
    session.append(_session_cores(_cores(), window))
    step = _step_figures(size)
    session.append(_session_cores(_cores(), window))
    figures: dict[str, Any] = {
        "format": FORMAT, "host": socket.gethostname(), "cpu": _cpu_name(),
        "cores": _cores(),
        "threads": threads,
        "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
        "torch": torch.__version__, "size": size,
        "measured_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        **{k: {"all": every[k][0], "one": one[k][0], "cpu": one[k][1]} for k in every},
        **{k: {"one": wall, "cpu": cpu} for k, (wall, cpu) in step.items()},
        "launch_overhead": _launch_overhead(200 if size == "tiny" else 2000, SIZES[size][-1]),
        "kernel_rates": _kernel_rates(size),
    }
    session.append(_session_cores(_cores(), window))
    figures["session_cores"] = sum(session) / len(session)
    if collectives:
        figures["allreduce"] = _allreduce(size)
    return figures
