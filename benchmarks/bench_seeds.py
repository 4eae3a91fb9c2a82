"""The seeds' headline cases, simulated, beside the papers' figures.

* vDNN (Rhu et al., MICRO 2016): VGG-16 at batch 256 needs about 28 GB keeping everything; with
  its feature maps offloaded to host memory it trains on a 12 GB Titan X at about 18% loss
  against an ideal GPU with enough memory.
* Chen et al. 2016 (√n checkpointing): a 1,000-layer residual network goes from 48 GB to 7 GB
  for about 30% more time.

"Ideal" is the same GPU with unbounded memory, keeping everything. Run:
``python benchmarks/bench_seeds.py``.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import memflow  # noqa: E402
from memflow.sim import Simulator  # noqa: E402
from memflow.strategy import Strategy  # noqa: E402
from _results import table, write_section  # noqa: E402

GB = 1e9


def row(sim: Simulator, s: Strategy, ideal_time: float | None, paper: str) -> dict:
    r = sim.evaluate(s)
    at_peak = sim.result(s).breakdown().iloc[0]
    return {"peak_GB": r.peak.max() / GB, "activations_at_peak_GB": at_peak["activations"] / GB,
            "weights+grads_GB": (at_peak["weights"] + at_peak["gradients"]) / GB,
            "capacity_GB": r.capacity.max() / GB,
            "feasible": r.feasible, "time_ms": r.iteration_time * 1e3,
            "overhead": (r.iteration_time / ideal_time - 1) if ideal_time else 0.0,
            "paper": paper}


def vdnn() -> dict:
    g = memflow.zoo.graph("vgg16", batch_size=256)
    titan = memflow.Cluster.preset("1xTitanX")
    ideal = Simulator(g, titan.with_memory("1TB"))
    real = Simulator(g, titan)
    keep = Strategy.single_device(g)
    t_ideal = ideal.evaluate(keep).iteration_time
    saves = g.units["saved_bytes"] > 0
    offload_all = keep.with_policy(offload=list(g.units.index[saves]))
    conv = saves & (g.units["kind"] == "Conv2d")
    offload_conv = keep.with_policy(offload=list(g.units.index[conv]))
    return {
        "VGG-16 b256, keep all (ideal GPU)": row(ideal, keep, t_ideal, "28 GB"),
        "VGG-16 b256, keep all on Titan X 12 GB": row(real, keep, t_ideal, "does not fit"),
        "VGG-16 b256, offload all (vDNN_all), Titan X": row(real, offload_all, t_ideal,
                                                            "fits, 18% loss"),
        "VGG-16 b256, offload conv inputs (vDNN_conv), Titan X": row(real, offload_conv, t_ideal,
                                                                    "fits"),
    }


def chen(n: int = 1000, target_gb: float = 48.0) -> dict:
    probe = memflow.zoo.graph("chain", batch_size=64, n=n, kind="residual", width=1024,
                              units="blocks")
    est = memflow.estimate(probe, "cuda").loc["activations", "max"]
    batch = max(1, int(round(64 * target_gb * GB / est)))
    g = memflow.zoo.graph("chain", batch_size=batch, n=n, kind="residual", width=1024,
                          units="blocks")
    gpu = memflow.Cluster.preset("1xV100-32GB").with_memory("1TB")
    sim = Simulator(g, gpu)
    keep = Strategy.single_device(g)
    t_ideal = sim.evaluate(keep).iteration_time
    k = int(math.ceil(math.sqrt(len(g))))
    names = g.names
    rec = [u for i, u in enumerate(names) if (i + 1) % k != 0 and i < len(names) - 1]
    sqrt_n = keep.with_policy(recompute=rec)
    return {
        f"{n}-layer residual chain b{batch}, keep all": row(sim, keep, t_ideal, "48 GB"),
        f"{n}-layer residual chain, √n checkpointing (segments of {k - 1})":
            row(sim, sqrt_n, t_ideal, "7 GB, +30% time"),
    }


def main() -> None:
    rows = {**vdnn(), **chen()}
    df = pd.DataFrame.from_dict(rows, orient="index")
    df.index.name = "case"
    print(df.to_string())
    fmt = df.copy()
    fmt["overhead"] = fmt["overhead"].map(lambda v: f"{v:+.0%}" if np.isfinite(v) else "")
    write_section("bench_seeds", table(fmt) + "\n\nSimulated: time model of "
                  "docs/data-model.md, fp32, SGD; 'ideal' is the same GPU with unbounded memory.",
                  title="Seeds' cases: vDNN offloading and √n checkpointing")


if __name__ == "__main__":
    main()
