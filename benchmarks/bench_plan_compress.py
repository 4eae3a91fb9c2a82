"""Error-bounded compression of saved activations (COMET), per error bound.

For resnet50, vgg16 and inception_v3 on one V100-16GB: the compression ratio SZ3 (pysz, COMET's
compressor; memflow's quantizer when pysz is missing) reaches on the models' real feature maps
(CPU forward of one image at a reduced resolution, random weights and inputs) beside the
quantizer's (the GPU path and the fallback), its CPU throughput, the gradient error of one real
training step with every saved activation
compressed, the ratio the simulator charges, the activation memory and the peak with and
without compression, and the largest batch that fits the GPU with and without; beside COMET's
"up to 13.5× less training memory". Then memflow's MCMC search started from the compressed
plan under a limit that keep-all does not meet.

Run: ``python benchmarks/bench_plan_compress.py [--quick]``.
"""
from __future__ import annotations

import argparse
import time
import warnings

import pandas as pd

import memflow
from memflow.planners import compress, compress_strategy
from memflow.planners.compress_measure import feature_map_ratios
from memflow.search import refine
from memflow.planners.common import Infeasible

from _results import refine_columns, table, write_section

GIB = 2 ** 30
DEVICE = "1xV100-16GB"
MODELS = {"resnet50": 32, "vgg16": 64, "inception_v3": 32}
# measured on one image at a reduced resolution: memflow's quantizer runs at a few MB/s on
# this CPU, and the ratio depends on the values' spread, not on the image size
MEASURE = {"resnet50": {"batch_size": 1, "image_size": 112},
           "vgg16": {"batch_size": 1, "image_size": 112},
           # without its auxiliary head, which needs a 17x17 map (299-pixel images); two
           # images because a BatchNorm needs more than one value per channel
           "inception_v3": {"batch_size": 2, "image_size": 139, "aux_logits": False}}
BOUNDS = (1e-4, 1e-3, 1e-2, 1e-1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="resnet50 only, short search")
    args = ap.parse_args()
    iters = 100 if args.quick else 300
    warnings.filterwarnings("ignore")
    models = {"resnet50": 32} if args.quick else MODELS
    parts, heads, searches = [], [], []
    for name, batch in models.items():
        g = memflow.zoo.graph(name, batch_size=batch)
        t0 = time.perf_counter()
        t = compress(g, DEVICE, error_bound=BOUNDS, measure=name,
                     measure_options=MEASURE[name])
        wall = time.perf_counter() - t0
        quantizer = feature_map_ratios(name, BOUNDS, compressor="quantizer", **MEASURE[name])
        show = pd.DataFrame({
            "measured ratio": t["measured_ratio"], "measured by": t["compressor"],
            "quantizer ratio": quantizer["ratio"], "CPU GB/s": t["throughput"] / 1e9,
            "max error": t["max_error"], "grad rel. error": t["grad_rel_error"],
            "simulator ratio": t["sim_ratio"], "simulator compressor": t["sim_compressor"],
            "activations (GiB)": t["activations"] / GIB,
            "activation reduction": t["activation_reduction"],
            "peak (GiB)": t["peak"] / GIB, "peak reduction": t["memory_reduction"],
            "step overhead": t["time"] / t["time_keep"] - 1,
            "largest batch": t["max_batch"], "batch gain": t["batch_gain"]})
        print(f"{name} b{batch} ({wall:.1f} s)")
        print(show.to_string())
        parts.append(f"**{name}, batch {batch}, {DEVICE}** (keep all: activations "
                     f"{t['activations_keep'].iloc[0] / GIB:.3g} GiB, peak "
                     f"{t['peak_keep'].iloc[0] / GIB:.3g} GiB, largest batch "
                     f"{int(t['max_batch_keep'].iloc[0])})\n\n" + table(show, ".3g"))
        heads.append({"model": name, "measured by": t["compressor"].iloc[0],
                      "best measured ratio": t["measured_ratio"].max(),
                      "best quantizer ratio": quantizer["ratio"].max(),
                      "best activation reduction (simulated)": t["activation_reduction"].max(),
                      "best peak reduction": t["memory_reduction"].max(),
                      "best batch gain": t["batch_gain"].max(),
                      "grad rel. error at 1e-2": t.loc[1e-2, "grad_rel_error"]})
        limit = 0.8 * t["peak_keep"].iloc[0]
        try:
            s = compress_strategy(g, DEVICE, error_bound=1e-2, memory_limit=limit)
        except Infeasible:
            s = None
        if s is not None:
            r = refine(g, DEVICE, s, iterations=iters, memory_limit=limit)
            searches.append({"model": name, "limit (GiB)": limit / GIB, **refine_columns(r)})
        left = [m for m in models if m not in {h["model"] for h in heads}]
        write(heads, parts, searches, left)


def write(heads, parts, searches, left: list[str]) -> None:
    """The section so far (after every model: measuring one takes minutes on 2 cores)."""
    head = pd.DataFrame(heads).set_index("model")
    comet = pd.DataFrame({"measured by": ["SZ (paper)"], "best measured ratio": [float("nan")],
                          "best quantizer ratio": [float("nan")],
                          "best activation reduction (simulated)": [float("nan")],
                          "best peak reduction": [13.5], "best batch gain": [float("nan")],
                          "grad rel. error at 1e-2": [float("nan")]},
                         index=pd.Index(["COMET (up to)"], name="model"))
    print(head.to_string())
    body = ("Absolute error bounds; every unit that saves something compresses it "
            "(memflow.planners.compress). 'measured ratio' is the compressor named in "
            "'measured by' — sz3 is SZ3 through pysz, what COMET compresses with — and "
            "'quantizer ratio' memflow's fixed-width quantizer (the GPU path, and the "
            "fallback without pysz), both on the model's real saved feature maps (CPU, one image at 112 "
            "pixels, two at 139 for inception_v3 without its auxiliary head; random weights "
            "and inputs: trained nets on real data compress differently); 'CPU GB/s' is its "
            "speed here (the measured compressor, single machine under load: noisy); 'max "
            "error' confirms the bound element-wise. The simulator charges "
            "'simulator ratio' (memflow.sim.cpu_time.compress_model: the ratios of 'simulator "
            "compressor', what the exported step runs on the device — the quantizer on a GPU — "
            "measured by bench_compress per map kind, each of the model's saved maps at its "
            "kind's, weighted by bytes; floating maps, as the measured ratio: integers such as "
            "max-pool indices are held whole, in the memory columns) — where it "
            "differs from the measured ratio, memory and batch figures follow the simulator's. "
            "COMET's published figure is its whole-training memory reduction (up to 13.5x, "
            "trained CNNs on ImageNet). 'largest batch' "
            "is the biggest batch that fits 16 GiB with compression (graph rescaled linearly, "
            "memflow.planners.at_batch)."
            + (f" Partial: {', '.join(left)} not measured yet when this was written."
               if left else "") + "\n\n" + table(pd.concat([comet, head]), ".3g") + "\n\n"
            + "\n\n".join(parts)
            + "\n\n**MCMC search started from the compressed plan (error bound 1e-2) under "
            "80% of keep-all's peak** (memflow.search.refine)\n\n"
            + (table(pd.DataFrame(searches).set_index("model"), ".4g") if searches else
               "no compressed plan fits that limit"))
    write_section("plan-compress", body, title="Error-bounded compression (COMET)")


if __name__ == "__main__":
    main()
