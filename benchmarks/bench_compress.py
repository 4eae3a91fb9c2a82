"""SZ3 and memflow's error-bounded quantizer on real feature maps: ratio, error and speed.

Runs zoo models for real on CPU (weights from the zoo's seed, training mode), collects every
floating tensor autograd saves for backward (what the ``compress`` policy would compress; each
storage once, parameters excluded) and compresses all of them at each error bound, in the
absolute mode and in the range-relative mode. Ratios are over all bytes (bytes-weighted), with
the quantizer alone (what a GPU holds; memflow's fallback), with its zlib stage, and with SZ3
(``pysz``: what COMET compresses with, memflow's CPU compressor when installed; columns
``sz3_*``, left out without pysz). Beside them: COMET's "up to 13.5x" (whole training memory,
SZ with entropy coding) and ActNN's 12x (2-bit activations).

Speed: single-thread CPU throughput on one 16 MB ReLU map, and the memory traffic (bytes read
and written by every torch op, counted by a dispatch mode) and op count per element, from
which ``memflow.compress.model`` predicts GPU throughput as bandwidth / traffic.

    python benchmarks/bench_compress.py            # a few minutes of CPU
    python benchmarks/bench_compress.py --quick    # smaller models, fewer bounds
"""
from __future__ import annotations

import argparse
import importlib.metadata
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import table, write_section  # noqa: E402

from memflow import zoo  # noqa: E402
from memflow.compress import FLOAT_DTYPES, compress, decompress, sz3_available  # noqa: E402
from memflow.graph.mapkind import MAP_KINDS, saved_maps  # noqa: E402

ABS_BOUNDS = (1e-1, 3e-2, 1e-2, 3e-3, 1e-3, 1e-4)
REL_BOUNDS = (1e-1, 1e-2, 1e-3, 1e-4)
MODELS = {  # name -> zoo options: real architectures, shrunk to run on a loaded 2-core CPU
    "resnet50": dict(batch_size=1, image_size=96),
    "vgg16": dict(batch_size=1, image_size=64),
    "gpt2": dict(batch_size=1, seq_len=128, n_layer=2),
    "bert-base": dict(batch_size=1, seq_len=128, n_layer=2),
}
QUICK = {"resnet50": dict(batch_size=1, image_size=64),
         "gpt2": dict(batch_size=1, seq_len=64, n_layer=2)}


def feature_maps(name: str, options: dict) -> list[torch.Tensor]:
    """Floating tensors autograd saves in one training forward of a zoo model (each once)."""
    model, inputs = zoo.get(name, device="cpu", seed=0, **options)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, torch.Tensor] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if t.dtype in FLOAT_DTYPES and ptr not in params and t.numel() >= 64:
            seen.setdefault(ptr, t.detach())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(*inputs)
    return list(seen.values())


def ratio_table(maps: dict[str, list[torch.Tensor]], bounds, relative: bool) -> pd.DataFrame:
    with_sz3 = sz3_available()
    rows = []
    for model, tensors in maps.items():
        for eb in bounds:
            print(f"  {model} eb={eb:g} ({'relative' if relative else 'absolute'})", flush=True)
            row = {"model": model, "error_bound": eb, "bytes": 0, "elements": 0, "packed": 0,
                   "lossless": 0, "max_error/bound": 0.0, "sz3": 0, "sz3_error/bound": 0.0}
            for t in tensors:
                if with_sz3:
                    p = compress(t, eb, relative=relative, compressor="sz3")
                    err = float((decompress(p).double() - t.double()).abs().max())
                    row["sz3"] += p.nbytes
                    if p.error_bound:
                        row["sz3_error/bound"] = max(row["sz3_error/bound"], err / p.error_bound)
                p = compress(t, eb, relative=relative, compressor="quantizer")
                err = float((decompress(p).double() - t.double()).abs().max())
                if p.error_bound:  # the guarantee: this stays <= 1
                    row["max_error/bound"] = max(row["max_error/bound"], err / p.error_bound)
                row["bytes"] += p.original_bytes
                row["elements"] += p.numel
                row["packed"] += p.nbytes
                row["lossless"] += compress(t, eb, relative=relative, lossless=True,
                                            compressor="quantizer").nbytes
            rows.append(row)
    df = pd.DataFrame(rows)
    pooled = df.groupby("error_bound", sort=False).agg(
        {"bytes": "sum", "elements": "sum", "packed": "sum", "lossless": "sum",
         "max_error/bound": "max", "sz3": "sum", "sz3_error/bound": "max"}
    ).reset_index().assign(model="all")
    df = pd.concat([df, pooled], ignore_index=True)
    sz = {"sz3_bits": 8 * df["sz3"] / df["elements"], "sz3_ratio": df["bytes"] / df["sz3"],
          "sz3_error/bound": df["sz3_error/bound"]} if with_sz3 else {}
    return pd.DataFrame({
        "model": df["model"], "error_bound": df["error_bound"], "MB": df["bytes"] / 1e6,
        "bits": 8 * df["packed"] / df["elements"],
        "bits_lossless": 8 * df["lossless"] / df["elements"],
        "ratio": df["bytes"] / df["packed"], "ratio_lossless": df["bytes"] / df["lossless"],
        "max_error/bound": df["max_error/bound"], **sz})


def kind_table(models: dict[str, dict], bounds) -> pd.DataFrame:
    """Bits per element and ratio per map kind (labelled by the op that wrote each map, the
    rule capture uses: :class:`memflow.graph.mapkind.KindLabels`), pooled over every model's
    maps, for each compressor that runs here (absolute bounds: what ``compress`` uses)."""
    by_kind: dict[str, list[torch.Tensor]] = {}
    for name, options in models.items():
        model, inputs = zoo.get(name, device="cpu", seed=0, **options)
        for t, kind in saved_maps(model, *inputs):
            by_kind.setdefault(kind, []).append(t)
    rows = []
    for compressor in (("sz3", "quantizer") if sz3_available() else ("quantizer",)):
        for kind in MAP_KINDS:
            tensors = by_kind.get(kind, [])
            for eb in bounds:
                print(f"  {compressor} {kind} eb={eb:g}", flush=True)
                size = sum(t.numel() * t.element_size() for t in tensors)
                elements = sum(t.numel() for t in tensors)
                packed = sum(compress(t, eb, compressor=compressor).nbytes for t in tensors)
                rows.append({"compressor": compressor, "map_kind": kind, "error_bound": eb,
                             "maps": len(tensors), "MB": size / 1e6,
                             "bits": 8 * packed / elements if elements else float("nan"),
                             "ratio": size / packed if packed else float("nan")})
    return pd.DataFrame(rows)


class Traffic(TorchDispatchMode):
    """Bytes read + written and ops run by torch kernels (views cost nothing)."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        schema = func._schema
        if schema.returns and schema.returns[0].alias_info is not None and not schema.is_mutable:
            return out  # a view
        leaves = pytree.tree_leaves((args, kwargs, out))
        self.bytes += sum(t.numel() * t.element_size() for t in leaves
                          if isinstance(t, torch.Tensor))
        self.ops += 1
        return out


def speed_table(bounds, quick: bool) -> pd.DataFrame:
    torch.manual_seed(0)
    n = (1 << 20) if quick else (1 << 22)
    x = torch.relu(torch.randn(n) * 2)
    rows = []
    for eb in bounds:
        (p, t_c), (_, t_d) = timed(x, eb, "quantizer")
        with Traffic() as tc:
            p = compress(x, eb, compressor="quantizer")
        with Traffic() as td:
            decompress(p)
        row = {"error_bound": eb, "bits": p.bits, "ratio": p.ratio,
               "cpu_compress_MBps": 4 * n / t_c / 1e6, "cpu_decompress_MBps": 4 * n / t_d / 1e6,
               "traffic_compress_B/elem": tc.bytes / n,
               "traffic_decompress_B/elem": td.bytes / n,
               "ops_compress": tc.ops, "ops_decompress": td.ops}
        if sz3_available():
            (p, t_c), (_, t_d) = timed(x, eb, "sz3")
            row.update({"sz3_ratio": p.ratio, "sz3_compress_MBps": 4 * n / t_c / 1e6,
                        "sz3_decompress_MBps": 4 * n / t_d / 1e6})
        rows.append(row)
    return pd.DataFrame(rows)


def timed(x: torch.Tensor, eb: float, compressor: str) -> tuple[tuple, tuple]:
    """((packed, compress seconds), (tensor, decompress seconds)) of one round trip."""
    t0 = time.perf_counter()
    p = compress(x, eb, compressor=compressor)
    t1 = time.perf_counter()
    y = decompress(p)
    return (p, t1 - t0), (y, time.perf_counter() - t1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small models, few bounds")
    args = ap.parse_args()
    models = QUICK if args.quick else MODELS
    abs_bounds = ABS_BOUNDS[::3] if args.quick else ABS_BOUNDS
    rel_bounds = REL_BOUNDS[::2] if args.quick else REL_BOUNDS

    torch.set_num_threads(1)  # a shared 2-core machine: extra threads only add contention
    start = time.perf_counter()
    maps = {name: feature_maps(name, opts) for name, opts in models.items()}
    absolute = ratio_table(maps, abs_bounds, relative=False)
    relative = ratio_table(maps, rel_bounds, relative=True)
    kinds = kind_table(models, abs_bounds)
    speed = speed_table(abs_bounds, args.quick)
    traffic = {int(r.bits): (round(r[5], 2), round(r[6], 2)) for r in speed.itertuples(index=False)}
    ops = {int(r.bits): (int(r[7]), int(r[8])) for r in speed.itertuples(index=False)}
    elapsed = time.perf_counter() - start

    pd.set_option("display.width", 160)
    for title, df in (("absolute bound", absolute), ("relative bound", relative),
                      ("by map kind", kinds), ("speed", speed)):
        print(f"\n== {title}\n{df.to_string(index=False, float_format=lambda v: f'{v:.4g}')}")
    print("\nTRAFFIC =", traffic, "\nOPS =", ops)
    pooled = absolute[absolute["model"] == "all"]
    print("\nmeasured table for memflow/compress/model.py (absolute):")
    print({float(r.error_bound): round(float(r.bits), 3) for r in pooled.itertuples()})
    print({float(r.error_bound): round(float(r.bits_lossless), 3) for r in pooled.itertuples()})
    pooled_rel = relative[relative["model"] == "all"]
    print("relative:")
    print({float(r.error_bound): round(float(r.bits), 3) for r in pooled_rel.itertuples()})
    print({float(r.error_bound): round(float(r.bits_lossless), 3) for r in pooled_rel.itertuples()})
    by_kind = {(c, k): {float(r.error_bound): round(float(r.bits), 3) for r in g.itertuples()}
               for (c, k), g in kinds.groupby(["compressor", "map_kind"], sort=False)}
    print("by map kind (absolute):", by_kind)

    sizes = ", ".join(f"{m} {opts}" for m, opts in models.items())
    pysz_version = importlib.metadata.version("pysz") if sz3_available() else "not installed"
    body = f"""Feature maps: every floating tensor autograd saves in one training forward of {sizes}
(zoo weights, CPU, fp32). Ratio = original bytes / compressed bytes over all maps; `bits` per
element; `max_error/bound` <= 1 is the guarantee. Which compressor: `bits`, `ratio` and
`max_error/bound` are **memflow's fixed-width quantizer** (the GPU path and the fallback without
pysz; headers and outliers counted); `*_lossless` the quantizer with its zlib stage (CPU);
`sz3_*` are **SZ3** (pysz {pysz_version}: prediction + quantization + Huffman + zstd, COMET's
compressor; memflow keeps zeros of maps >= 0 exact and stores bound misses as outliers, all
counted). Beside: COMET reports up to **13.5x** less training memory (SZ with entropy coding,
trained CNNs on ImageNet), ActNN **12x** less activation memory (2-bit). Random weights and
inputs here: trained networks on real data give other ratios. The machine was loaded (see
load) — speeds are noisy.

### Absolute error bound

{table(absolute)}

### Relative error bound (eb x value range of each map)

{table(relative)}

### By map kind (absolute bound)

The same maps by kind (:mod:`memflow.graph.mapkind`: labelled by the op that wrote each map,
the rule capture applies), pooled over the models, per compressor: `sz3` is SZ3 (pysz), `quantizer` memflow's fixed-width quantizer.
`memflow.compress.model.BY_KIND` stores these `bits`: the memory model charges each saved
record the ratio of its kind under the compressor the step runs (SZ3 on a CPU with pysz,
the quantizer on a GPU or without pysz).

{table(kinds)}

### Speed (one 16 MB ReLU map, one CPU thread) and memory traffic for the GPU model

`ratio`/`cpu_*` the quantizer, `sz3_*` SZ3, on the same synthetic map (ReLU of N(0, 4)).

{table(speed)}

`memflow.compress.model` stores the pooled `bits` columns (`MEASURED`) and, per code width,
(compress, decompress) traffic in bytes per element `TRAFFIC = {traffic}` and ops
`OPS = {ops}`; `throughput(bandwidth) = bandwidth x 4 / traffic` (fp32). Took {elapsed:.0f} s.
"""
    write_section("compress", body, title="Error-bounded compression of feature maps")


if __name__ == "__main__":
    main()
