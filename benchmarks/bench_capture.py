"""Capture speed and memory: gpt2-xl at batch 8 x 1024 tokens, and every zoo model.

Each model is captured in a fresh Python process (``--one NAME``), so its peak resident memory
(``ru_maxrss``) is its own; the resident memory after importing torch and building the model
on meta is shown too, the difference is capture's. Times are wall clock and process CPU time:
on a shared machine the wall clock also counts other people's work. Targets (issue 2):
gpt2-xl under 10 s and under 2 GB.

    python benchmarks/bench_capture.py            # all zoo models
    python benchmarks/bench_capture.py gpt2-xl    # some of them
"""
from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

TARGET = ("gpt2-xl", 8)          # model, batch size of the headline figure


def one(name: str) -> dict:
    """Capture zoo model ``name`` at its default batch (8 x 1024 tokens for gpt2-xl)."""
    import torch

    from memflow import zoo
    from memflow.graph.capture import from_torch

    batch = TARGET[1] if name == TARGET[0] else None
    model, inputs = zoo.get(name, batch_size=batch)
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    wall, cpu = time.perf_counter(), time.process_time()
    graph = from_torch(model, inputs)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"model": name, "batch": int(graph.meta["batch_size"]), "units": len(graph),
            "params (M)": graph.units["params"].sum() / 1e6,
            "saved (GiB)": graph.units["saved_bytes"].sum() / 2 ** 30,
            "wall (s)": wall, "cpu (s)": cpu, "peak RSS (MB)":
                resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "RSS before capture (MB)": base_rss,
            "torch": torch.__version__}


def main(names: list[str]) -> pd.DataFrame:
    from _results import table, write_section

    from memflow import zoo

    rows = []
    for name in names or zoo.names():
        done = subprocess.run([sys.executable, __file__, "--one", name], capture_output=True,
                              text=True, check=True)
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(f"{name}: {rows[-1]['wall (s)']:.1f} s wall, {rows[-1]['cpu (s)']:.1f} s cpu, "
              f"{rows[-1]['peak RSS (MB)']:.0f} MB", flush=True)
    df = pd.DataFrame(rows).set_index("model").drop(columns=["torch"])
    print(df.to_string(float_format=lambda v: f"{v:,.2f}"))
    if not names:
        xl = df.loc[TARGET[0]]
        verdict = (f"gpt2-xl, batch 8 x 1024 tokens: {xl['wall (s)']:.1f} s wall "
                   f"({xl['cpu (s)']:.1f} s CPU), peak {xl['peak RSS (MB)']:.0f} MB — target "
                   f"< 10 s and < 2 GB: {'met' if xl['cpu (s)'] < 10 and xl['peak RSS (MB)'] < 2048 else 'NOT met'} "
                   "(CPU time; the wall clock counts other jobs on a shared machine).")
        write_section("capture", f"{verdict}\n\n{table(df, '.3g')}",
                      title="Capture: time and memory (every zoo model at its default batch)")
    return df


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--one":
        print(json.dumps(one(sys.argv[2])))
    else:
        main(sys.argv[1:])
