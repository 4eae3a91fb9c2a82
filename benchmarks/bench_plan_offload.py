"""Offloading saved activations to host memory: vDNN's policies and two relaxation heuristics.

VGG-16 on a 12 GB Titan X (PCIe 3), vDNN's headline case: at batch 256 it needs 28 GB in vDNN's
measurements and trains with offloading at 18% loss against an ideal GPU with enough memory.
memflow.planners.offload_table gives, per policy, the simulated peak, whether it fits, and the
loss against the same GPU with unbounded memory keeping everything; then memflow's MCMC
search is started from every plan that fits.

Run: ``python benchmarks/bench_plan_offload.py [--quick]``.
"""
from __future__ import annotations

import argparse
import time
import warnings

import pandas as pd

import memflow
from memflow.planners import offload, offload_table
from memflow.search import refine
from memflow.planners.common import Infeasible

from _results import refine_columns, table, write_section

GIB = 2 ** 30
DEVICE = "1xTitanX"
POLICIES = ("none", "conv", "all", "dynamic", "knapsack", "fluid")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="batches 256 and 192 only, short search")
    args = ap.parse_args()
    iters = 100 if args.quick else 300
    warnings.filterwarnings("ignore")
    parts, searches, heads = [], [], []
    # quick keeps batch 192: at 256 nothing fits, so no search would start from a plan
    for batch in ((256, 192) if args.quick else (256, 192, 128)):
        g = memflow.zoo.graph("vgg16", batch_size=batch)
        t0 = time.perf_counter()
        t = offload_table(g, DEVICE, POLICIES)
        wall = time.perf_counter() - t0
        show = pd.DataFrame({"fits 12 GiB": t["fits"], "peak (GiB)": t["peak"] / GIB,
                             "offloaded (GiB)": t["offloaded"] / GIB, "time (s)": t["time"],
                             "loss vs ideal": t["loss"], "plan": t["strategy"]})
        print(f"vgg16 batch {batch} ({wall:.1f} s)")
        print(show.to_string())
        parts.append(f"**vgg16, batch {batch}** (ideal: {t.attrs['ideal_time']:.4g} s per "
                     "step)\n\n" + table(show, ".3g"))
        fit = show[show["fits 12 GiB"]]
        heads.append({"batch": batch, "keep all (GiB)": show.loc["none", "peak (GiB)"],
                      "least peak by offloading (GiB)": show["peak (GiB)"].min(),
                      "fastest fitting policy": fit["loss vs ideal"].idxmin() if len(fit)
                      else "none fits",
                      "its loss": fit["loss vs ideal"].min() if len(fit) else float("nan")})
        for pol in ("dynamic", "knapsack", "fluid"):
            try:
                s = offload(g, DEVICE, pol)
            except Infeasible:
                continue
            r = refine(g, DEVICE, s, iterations=iters)
            searches.append({"batch": batch, "policy": pol, **refine_columns(r)})
    head = pd.DataFrame(heads).set_index("batch")
    vdnn = pd.DataFrame({"keep all (GiB)": [28e9 / GIB], "least peak by offloading (GiB)":
                         ["fits 12 GB"], "fastest fitting policy": ["vDNN (dyn)"],
                         "its loss": [0.18]}, index=pd.Index(["vDNN, batch 256"], name="batch"))
    print(head.to_string())
    body = ("Titan X (Maxwell, 12 GiB, PCIe 3 to the host). 'loss' = simulated step time over "
            "the same GPU with unbounded memory keeping everything (vDNN's measure). Policies: "
            "vDNN all / conv / dynamic (first of none, conv, all that fits); 'knapsack' and "
            "'fluid' = the two relaxation heuristics after Beaumont et al. (Euro-Par 2020), "
            "see memflow.planners.offload. Offloads start when a unit's forward ends; prefetches are "
            "issued one unit ahead in backward (vDNN's rule), both on the PCIe channels. "
            "memflow's memory model holds more than vDNN at the peak (its ReLUs are not in "
            "place and activation gradients of both neighbours are live), so its keep-all "
            "peak and its least peak with offloading differ from vDNN's figures.\n\n"
            + table(pd.concat([vdnn, head.astype(object)]), ".3g") + "\n\n"
            + "\n\n".join(parts)
            + "\n\n**MCMC search started from each plan that fits** (memflow.search.refine)\n\n"
            + (table(pd.DataFrame(searches).set_index(["batch", "policy"]), ".4g")
               if searches else "no offloading plan fits, so no search was started"))
    write_section("plan-offload", body, title="Offloading (vDNN, Beaumont et al. 2020)")


if __name__ == "__main__":
    main()
