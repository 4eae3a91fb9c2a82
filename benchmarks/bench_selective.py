"""Selective recomputation against PyTorch's min-cut partitioner.

Two models: a 12-block MLP chain (Linear + GELU + LayerNorm, widths cycling 256, 512, 1024,
2048, batch 512) and a ResNet-18-like CNN (basic blocks [2, 2, 2, 2], batch 32, 64² images),
units = blocks. Per model, on CPU with real tensors:

* **keep** — the bytes autograd holds for backward (``memflow.export.held_bytes``);
* **memflow selective** — every block ``selective``: bytes held predicted by memflow's memory
  model and measured on the exported model (PyTorch's selective activation checkpointing),
  FLOPs recomputed (the blocks' cheap ops, memflow's op costs) and the step-time overhead
  memflow's simulator gives on one A100;
* **memflow recompute** — every block ``recompute``, for reference;
* **memflow ILP 0.5** — :func:`memflow.planners.selective.selective_plan` on the leaf-unit
  graph (a unit per Linear, GELU, LayerNorm, Conv2d, BatchNorm…, so the keep/selective choice
  is per operation) at half of what keeping everything holds (else the least of 0.6…0.9 it
  can meet);
* **memflow search** — :class:`memflow.MCMCSearch` on the leaf-unit graph, 300 steps from
  keep, within the ILP plan's simulated peak, with the memory moves (``policy``, ``segment``)
  and with the ``per_op`` move added (the ILP's plans copied onto runs of units);
* **torch min-cut 0.5** — ``torch.compile`` with AOTAutograd's min-cut partitioner under
  ``torch._functorch.config.activation_memory_budget = 0.5``: bytes the compiled forward saves
  (``saved_tensors_hooks``, each storage once, parameters left out), and the ops its backward
  graph recomputes (the backward's op counts minus those of the budget-1.0 partition).

Run: ``python benchmarks/bench_selective.py`` (``--quick``: batch 64, widths / 4, 32² images).
"""
from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

import pandas as pd
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT)]

from _results import table, write_section  # noqa: E402
import memflow  # noqa: E402
from memflow.export import held_bytes, validate  # noqa: E402
from memflow.export.validation import predicted_held  # noqa: E402
from memflow.graph.selective import EXPENSIVE_OPS  # noqa: E402
from memflow.planners import Infeasible, selective_plan  # noqa: E402
from memflow.strategy import Strategy  # noqa: E402


class Block(nn.Module):
    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.fc, self.act, self.norm = nn.Linear(n_in, n_out), nn.GELU(), nn.LayerNorm(n_out)

    def forward(self, x):
        return self.norm(self.act(self.fc(x)))


def mlp_chain(batch: int, scale: int) -> tuple[nn.Module, torch.Tensor]:
    widths = [w // scale for w in (256, 512, 1024, 2048) * 3]
    dims = [widths[-1]] + widths
    model = nn.Sequential(*(Block(a, b) for a, b in zip(dims[:-1], dims[1:])))
    return model, torch.randn(batch, dims[0])


class Basic(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.down = (nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False),
                                   nn.BatchNorm2d(c_out)) if stride != 1 or c_in != c_out
                     else nn.Identity())

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.down(x))


def resnet18(batch: int, image: int) -> tuple[nn.Module, torch.Tensor]:
    layers: list[nn.Module] = [nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False),
                                             nn.BatchNorm2d(64), nn.ReLU())]
    c = 64
    for i, w in enumerate((64, 128, 256, 512)):
        for j in range(2):
            layers.append(Basic(c, w, 2 if i and not j else 1))
            c = w
    layers.append(nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, 10)))
    return nn.Sequential(*layers), torch.randn(batch, 3, image, image)


def _saved_by_compiled(model: nn.Module, x: torch.Tensor, budget: float) -> tuple[int, dict]:
    """Bytes the min-cut partition saves, and its backward graph's op counts."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    counts: collections.Counter = collections.Counter()

    def fw(gm, _):
        return make_boxed_func(gm.forward)

    def bw(gm, _):
        counts.update(str(n.target).split(".")[1] for n in gm.graph.nodes
                      if n.op == "call_function" and str(n.target).startswith("aten."))
        return make_boxed_func(gm.forward)

    backend = aot_autograd(fw_compiler=fw, bw_compiler=bw,
                           partition_fn=min_cut_rematerialization_partition)
    torch._dynamo.reset()
    weights = {t.untyped_storage()._cdata for t in model.parameters()} | {
        t.untyped_storage()._cdata for t in model.buffers()}
    seen: dict[int, int] = {}

    def pack(t):
        key = t.untyped_storage()._cdata
        if key not in weights:
            seen[key] = t.untyped_storage().nbytes()
        return t

    with torch._functorch.config.patch(activation_memory_budget=budget):
        compiled = torch.compile(model, backend=backend)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = compiled(x)
        out.sum().backward()
    return sum(seen.values()), counts


SEARCH_MOVES = {"policy": 0.6, "segment": 0.4}     # the memory moves, without per_op
SEARCH_STEPS = 300


def searched(name: str, model: nn.Module, x: torch.Tensor, leaves, plan: Strategy, keep: float,
             cluster, base: float) -> list[dict]:
    """MCMCSearch on the leaf units within the ILP plan's simulated peak, from keep, with the
    memory moves and with the per_op move added (the best of its run)."""
    limit = float(memflow.simulate(leaves, plan, cluster).peak_memory.max())
    out = []
    for label, moves in (("policy+segment", SEARCH_MOVES),
                         ("+ per_op", {**SEARCH_MOVES, "per_op": 0.1})):
        t0 = time.perf_counter()
        search = memflow.MCMCSearch(leaves, cluster, memory_limit=limit, moves=moves, seed=0)
        s = search.step(SEARCH_STEPS).best
        elapsed = time.perf_counter() - t0
        measured = validate(model, x, s, leaves).loc["saved_bytes", "measured"]
        pol = leaves.units.assign(policy=s.policies)
        sel, rec = pol[pol["policy"] == "selective"], pol[pol["policy"] == "recompute"]
        flops = (sel["fwd_flops"] - sel["expensive_fwd_flops"]).sum() + rec["fwd_flops"].sum()
        out.append({"model": name, "plan": f"memflow search {label} (leaf units)",
                    "held (MiB)": measured / 2**20, "held / keep": measured / keep,
                    "predicted / measured": sum(predicted_held(leaves, s).values()) / measured,
                    "GFLOP recomputed": flops / 1e9,
                    "matmul/conv recomputed": int((rec["expensive_fwd_ops"] > 0).sum()),
                    "sim overhead %": 100 * (search.best_result.iteration_time / base - 1),
                    "solve (s)": elapsed})
    return out


def rows(name: str, model: nn.Module, x: torch.Tensor) -> list[dict]:
    model.train()
    keep = held_bytes(model, x)["cpu"]
    graph = memflow.from_torch(model, x, units="blocks")
    blocks = [u for u in graph.names if graph.units.loc[u, "fwd_flops"] > 0]
    plain = Strategy.single_device(graph)
    cluster = memflow.Cluster.preset("1xA100-40GB")
    base = memflow.simulate(graph, plain, cluster).iteration_time
    out = [{"model": name, "plan": "keep", "held (MiB)": keep / 2**20, "held / keep": 1.0,
            "GFLOP recomputed": 0.0, "matmul/conv recomputed": 0, "sim overhead %": 0.0}]
    u = graph.units.loc[blocks]
    for policy in ("selective", "recompute"):
        s = plain.with_policy({b: policy for b in blocks})
        measured = validate(model, x, s, graph).loc["saved_bytes", "measured"]
        predicted = predicted_held(graph, s)["gpu0"] if "gpu0" in s.device_names else \
            sum(predicted_held(graph, s).values())
        flops = u["fwd_flops"] - (u["expensive_fwd_flops"] if policy == "selective" else 0)
        step = memflow.simulate(graph, s, cluster).iteration_time
        out.append({"model": name, "plan": f"memflow {policy}", "held (MiB)": measured / 2**20,
                    "held / keep": measured / keep, "predicted / measured": predicted / measured,
                    "GFLOP recomputed": flops.sum() / 1e9,
                    "matmul/conv recomputed": "none" if policy == "selective" else "all",
                    "sim overhead %": 100 * (step / base - 1)})
    leaves = memflow.from_torch(model, x, units="leaves")
    t0 = time.perf_counter()
    for fraction in (0.5, 0.6, 0.7, 0.8, 0.9):      # the least budget the ILP can meet
        try:
            s = selective_plan(leaves, fraction * keep)
            break
        except Infeasible:
            continue
    solve = time.perf_counter() - t0
    measured = validate(model, x, s, leaves).loc["saved_bytes", "measured"]
    on = leaves.units.loc[[u for u, p in zip(leaves.names, s.policies) if p == "selective"]]
    step = memflow.simulate(leaves, s, cluster).iteration_time
    base_leaves = memflow.simulate(leaves, Strategy.single_device(leaves), cluster).iteration_time
    out.append({"model": name, "plan": f"memflow ILP {fraction} (leaf units)",
                "held (MiB)": measured / 2**20, "held / keep": measured / keep,
                "predicted / measured": sum(predicted_held(leaves, s).values()) / measured,
                "GFLOP recomputed": (on["fwd_flops"] - on["expensive_fwd_flops"]).sum() / 1e9,
                "matmul/conv recomputed": "none", "sim overhead %": 100 * (step / base_leaves - 1),
                "solve (s)": solve})
    out += searched(name, model, x, leaves, s, keep, cluster, base_leaves)
    saved, counts = _saved_by_compiled(model, x, 0.5)
    _, full = _saved_by_compiled(model, x, 1.0)
    extra = counts - full
    out.append({"model": name, "plan": "torch min-cut 0.5", "held (MiB)": saved / 2**20,
                "held / keep": saved / keep, "GFLOP recomputed": float("nan"),
                "matmul/conv recomputed": sum(n for op, n in extra.items() if op in EXPENSIVE_OPS),
                "recomputed ops": sum(extra.values()), "sim overhead %": float("nan")})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="batch 64, widths / 4, 32² images")
    args = ap.parse_args()
    torch.manual_seed(0)
    t0 = time.perf_counter()
    mlp = mlp_chain(64, 4) if args.quick else mlp_chain(512, 1)
    cnn = resnet18(8, 32) if args.quick else resnet18(32, 64)
    df = pd.DataFrame(rows("MLP chain", *mlp) + rows("ResNet-18-like", *cnn))
    print(df.to_string())
    sizes = ("--quick: MLP batch 64, widths 64…512; CNN batch 8, 32² images" if args.quick
             else "MLP batch 512, widths 256…2048; CNN batch 32, 64² images")
    body = (f"{sizes}. Held bytes on CPU with real tensors; memflow's plans put every block "
            "under one policy, or the ILP picks keep/selective per leaf unit, or MCMCSearch "
            f"({SEARCH_STEPS} steps from keep, within the ILP plan's simulated peak) searches "
            "the leaf units with the memory moves, then with per_op added (solve = search "
            "time); torch's column is AOTAutograd's "
            "min-cut partition at `activation_memory_budget=0.5` (saved tensors of the "
            "compiled forward; recomputed ops = its backward graph's ops beyond the budget-1.0 "
            "partition's). Simulated overhead: step time on 1xA100-40GB against keep.\n\n"
            + table(df, floatfmt=".3g")
            + f"\n\nRun time {time.perf_counter() - t0:.0f} s.")
    write_section("bench_selective", body,
                  title="Selective recomputation against torch's min-cut partitioner")


if __name__ == "__main__":
    main()
