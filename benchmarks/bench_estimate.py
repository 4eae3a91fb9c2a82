"""``memflow.estimate`` against PyTorch's MemTracker on a real CPU training step, every zoo model.

Each model is shrunk so a real CPU step stays short (small batch, small images, a few layers,
short sequences); the same configuration is captured on meta tensors and estimated. The step
is forward, ``output.sum()``, backward, ``optimizer.step()``, ``zero_grad(set_to_none=True)``,
measured in the steady state (second step). Target (issue 2): within 5%.

Run: ``python benchmarks/bench_estimate.py [--optimizers sgd adam]``.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import memflow  # noqa: E402
from memflow.memory.measure import memtracker_peak  # noqa: E402
from _results import table, write_section  # noqa: E402

TEXT = dict(batch_size=2, seq_len=32, n_layer=2)
SHRUNK = {
    "alexnet": dict(batch_size=2, image_size=64, hidden=512),
    "vgg16": dict(batch_size=2, image_size=32, hidden=512),
    "vgg19": dict(batch_size=2, image_size=32, hidden=512),
    "resnet50": dict(batch_size=2, image_size=64),
    "resnet101": dict(batch_size=2, image_size=64),
    "inception_v3": dict(batch_size=2, image_size=299),   # its aux head's 5x5 conv needs 299
    "googlenet": dict(batch_size=2, image_size=64),
    "gpt2": TEXT, "gpt2-medium": TEXT, "gpt2-large": TEXT, "gpt2-xl": TEXT,
    "bert-base": TEXT, "bert-large": TEXT,
    "gnmt": dict(batch_size=2, src_len=8, tgt_len=8, n_layer=2, hidden=256, vocab=2000),
    "biglstm": dict(batch_size=2, seq_len=8, vocab=5000, hidden=1024, embed=256, proj=256),
    "mlp": dict(batch_size=8),
    "chain": dict(batch_size=8, n=10, width=256),
}


def compare(name: str, cfg: dict, optimizer: str) -> dict:
    t = time.perf_counter()
    model, inputs = memflow.zoo.get(name, device="cpu", **cfg)
    measured = memtracker_peak(model, inputs, optimizer=optimizer)
    g = memflow.zoo.graph(name, **cfg)
    est = memflow.estimate(g, "cpu", optimizer=optimizer)
    total = measured["Total"]
    return {"config": ", ".join(f"{k}={v}" for k, v in cfg.items()), "optimizer": optimizer,
            "memtracker_MiB": total / 2 ** 20,
            "estimate_MiB": est.loc["total", "at_peak"] / 2 ** 20,
            "error": est.loc["total", "at_peak"] / total - 1,
            "estimate_peak_at": est.attrs["peak_task"], "seconds": time.perf_counter() - t}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--optimizers", nargs="+", default=["sgd", "adam"])
    ap.add_argument("--models", nargs="+", default=list(SHRUNK))
    args = ap.parse_args()
    rows = []
    for name in args.models:
        for opt in args.optimizers:
            try:
                row = compare(name, SHRUNK[name], opt)
            except Exception as exc:   # a model the tools cannot run is reported, not fatal
                row = {"config": str(SHRUNK[name]), "optimizer": opt,
                       "estimate_peak_at": f"failed: {type(exc).__name__}: {exc}"[:120]}
            rows.append({"model": name, **row})
            print(rows[-1], flush=True)
    df = pd.DataFrame(rows).set_index("model")
    fmt = df.copy()
    if "error" in fmt:
        fmt["error"] = fmt["error"].map(lambda v: f"{v:+.2%}" if v == v else "")
    within = (df["error"].abs() <= 0.05).sum() if "error" in df else 0
    write_section("bench_estimate", table(fmt.drop(columns=["seconds"], errors="ignore"))
                  + f"\n\n{within} of {len(df)} comparisons within 5%.",
                  title="estimate vs PyTorch MemTracker (real CPU step)")


if __name__ == "__main__":
    main()
