"""Measured forward times of a graph's module units on the real model: the data
``memflow.hardware.calibrate`` fits a device's efficiencies to (``bench_time.py`` on the CPU,
``bench_gpu.py`` on a GPU)."""
from __future__ import annotations

import statistics
import time

import pandas as pd
import torch

import memflow


def unit_times(name: str, batch: int, cfg: dict, graph, device: str,
               reps: int = 5) -> pd.DataFrame:
    """Each module unit of ``graph``'s forward on zoo model ``name`` (``batch``, options
    ``cfg``) on ``device``, timed at module hooks — CUDA events on a GPU (the stream's own
    time between them), ``time.perf_counter`` on the CPU — median of ``reps`` forwards under
    ``no_grad`` after one warm-up, beside the units' FLOPs, bytes moved and kernels (columns
    ``flops``, ``bytes_moved``, ``ops``, ``seconds``)."""
    net, inputs = memflow.zoo.get(name, batch, device=device, **cfg)
    modules = dict(net.named_modules())
    names = [u for u in graph.names if u in modules]
    cuda = torch.device(device).type == "cuda"
    marks: dict[str, list] = {u: [] for u in names}

    def mark():
        if cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def span(a, b) -> float:
        return a.elapsed_time(b) / 1e3 if cuda else b - a

    hooks = [h for u in names for h in (
        modules[u].register_forward_pre_hook(lambda m, a, u=u: marks[u].append([mark()])),
        modules[u].register_forward_hook(lambda m, a, o, u=u: marks[u][-1].append(mark())))]
    with torch.no_grad():
        for _ in range(reps + 1):
            net(*inputs)
    if cuda:
        torch.cuda.synchronize()
    for h in hooks:
        h.remove()
    units = graph.units.loc[names, ["fwd_flops", "fwd_bytes_moved", "fwd_ops"]]
    units.columns = ["flops", "bytes_moved", "ops"]
    units["seconds"] = [statistics.median(span(a, b) for a, b in marks[u][1:]) for u in names]
    return units
