"""The seeds' headline cases, simulated, beside the papers' figures.

* vDNN (Rhu et al., MICRO 2016): VGG-16 at batch 256 needs 28 GB; with its feature maps
  offloaded to host memory it trains on a 12 GB Titan X at 18% loss against an ideal GPU with
  enough memory (vDNN_dyn).
* Chen et al. 2016 (√n checkpointing): a 1,000-layer residual network goes from 48 GB to 7 GB
  for 30% more time.

What is printed, all computed here:

1. VGG-16's memory two ways: vDNN's own account (every feature map, gradient map, weight and
   weight gradient allocated for the whole step, no reuse) from the captured graph, and
   memflow's liveness-aware peak of keeping everything, by category.
2. VGG-16 on a Titan X: ``memflow.planners.offload``'s policies (vDNN's all, conv, dynamic;
   Beaumont et al.'s knapsack and fluid), offloading all plus recomputation of the first block,
   and an MCMC search from there, each as the simulator computes it, with the compute task and
   the memory categories at its peak and what it offloads and recomputes.
3. The memory model checked where those peaks are: a real CPU training step of VGG-16 at
   batch 2 (224 px; a small classifier so that feature maps dominate) under PyTorch's
   MemTracker, offloaded tensors copied to host (numpy) memory at pack time and back when
   backward unpacks them, recomputed runs as ``torch.utils.checkpoint`` segments, against
   ``memflow.estimate`` of the same strategies.
4. A 1,001-layer ImageNet ResNet (bottlenecks, stages of 3, 24, 303 and 3 blocks) at the batch
   where keeping everything needs 48 GB; Chen's √n segments (a checkpoint every ⌈√n⌉ units)
   and ``memflow.planners.checkpoint(method="sqrt")`` asked for 7 GB, and what of the gap to 7 GB
   is weights.

"Ideal" is the same GPU with unbounded memory, keeping everything. Run:
``python benchmarks/bench_seeds.py`` (a few minutes).
"""
from __future__ import annotations

import math
import sys
from functools import partial
from itertools import groupby
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import memflow  # noqa: E402
from memflow.graph import OpGraph  # noqa: E402
from memflow.graph.units import ROOT, module_paths  # noqa: E402
from memflow.memory.measure import memtracker_peak  # noqa: E402
from memflow.search import MCMCSearch  # noqa: E402
from memflow.sim import Simulator  # noqa: E402
from memflow.strategy import Strategy  # noqa: E402
from memflow.zoo.resnet import ResNet  # noqa: E402
from _results import table, write_section  # noqa: E402

GB = 1e9
MiB = 2 ** 20
COMPUTE = ("forward", "backward", "recompute")
SEARCH_STEPS = 1500


# ------------------------------------------------------------------ shared
def peak_at(result) -> str:
    """The compute task running when the device peaks, e.g. ``"backward features.3"``."""
    mem = result.memory
    t = mem.loc[mem["bytes"].idxmax(), "time"]
    tl = result.timeline
    now = tl[(tl["start"] <= t) & (tl["end"] > t) & tl["kind"].isin(COMPUTE)]
    return " ".join(now.iloc[0][["kind", "unit"]]) if len(now) else "end of step"


def row(sim: Simulator, s: Strategy, ideal_time: float, paper: str) -> dict[str, Any]:
    """One strategy as the simulator computes it: peak, where, categories, time."""
    r = sim.result(s)
    at_peak = r.breakdown().iloc[0]
    return {"peak_GB": r.peak_memory.max() / GB, "peak_at": peak_at(r),
            "activations_GB": at_peak["activations"] / GB,
            "transient_GB": at_peak["transient"] / GB,
            "weights+grads_GB": (at_peak["weights"] + at_peak["gradients"]) / GB,
            "fits": r.feasible, "time_s": r.iteration_time,
            "overhead": r.iteration_time / ideal_time - 1, "paper": paper}


# ------------------------------------------------------------------ vDNN: accounts
def no_reuse_account(g: OpGraph) -> pd.DataFrame:
    """vDNN's baseline: everything a layer touches allocated for the whole step, no reuse."""
    t, u = g.tensors, g.units
    maps = t[t["dtype"].str.startswith(("float", "bfloat"))]
    terms = {
        "feature maps X/Y": (maps["bytes"].sum(),
                             "every float activation storage once (the image, each layer's "
                             "output; in-place ReLUs share their input's)"),
        "gradient maps dX/dY": (maps.loc[maps["requires_grad"], "bytes"].sum(),
                                "one gradient per feature map that gets one"),
        "weights W": (u["param_bytes"].sum(), ""),
        "weight gradients dW": (u["trainable_bytes"].sum(), ""),
        "cuDNN workspace": (np.nan, "not in the graph: PyTorch on CPU picks no cuDNN algorithm"),
    }
    df = pd.DataFrame({"GB": [v / GB for v, _ in terms.values()],
                       "what": [w for _, w in terms.values()]}, index=list(terms))
    df.loc["total"] = [df["GB"].sum(), "vDNN (paper): 28 GB"]
    df.index.name = "vDNN-style account"
    return df


def liveness_account(g: OpGraph, sim: Simulator, keep: Strategy) -> pd.DataFrame:
    """memflow's keep-all peak by category, and what of it vDNN's account has no term for."""
    r = sim.result(keep)
    b = r.breakdown().iloc[0]
    t = g.tensors
    indices = t.loc[~t["dtype"].str.startswith(("float", "bfloat")), "bytes"].sum()
    saved = g.units["saved_bytes"].sum()
    rows = {
        "weights": (b["weights"] / GB, ""),
        "gradients": (b["gradients"] / GB, "weight gradients made so far"),
        "activations": (b["activations"] / GB,
                        f"saved storages still held (the graph saves {saved / GB:.2f} "
                        f"GB, {indices / GB:.2f} GB of it int64 max-pool indices: PyTorch keeps "
                        "them, cuDNN's pooling keeps none)"),
        "transient": (b["transient"] / GB, "activation gradients alive now: each lives from "
                      "its last reader's backward to its producer's backward"),
        "total": (r.peak_memory.max() / GB, f"at {peak_at(r)}"),
    }
    df = pd.DataFrame({"GB": [v for v, _ in rows.values()],
                       "what": [w for _, w in rows.values()]}, index=list(rows))
    df.index.name = "memflow keep-all peak"
    return df


# ------------------------------------------------------------------ vDNN: Titan X
PAPER = {"all": "fits (vDNN_all)", "conv": "fits (vDNN_conv)",
         "dynamic": "fits, 18% loss (vDNN_dyn)", "knapsack": "", "fluid": ""}


def planned(g: OpGraph, titan, policy: str) -> Strategy:
    """``memflow.planners.offload``'s strategy, or the lowest-peak one it tried when none fits."""
    try:
        return memflow.planners.offload(g, titan, policy)
    except memflow.planners.Infeasible as exc:
        return exc.best


def policy_mix(s: Strategy, g: OpGraph) -> str:
    """What a strategy does, e.g. ``"offload 29 units (15.3 GB); recompute 3 units in 1
    segment: features.0..features.2"``."""
    saved = g.units["saved_bytes"]
    pol = dict(zip(s.units, s.policies))
    off = [u for u in g.names if pol[u] == "offload"]
    segments = [[u for u, _ in run] for rec, run in
                groupby(((u, pol[u]) for u in g.names), lambda up: up[1] == "recompute") if rec]
    shown = ", ".join(f"{seg[0]}..{seg[-1]}" if len(seg) > 1 else seg[0]
                      for seg in segments[:3]) + (", ..." if len(segments) > 3 else "")
    n = len(segments)
    return (f"offload {len(off)} units ({saved[off].sum() / GB:.1f} GB); " +
            (f"recompute {sum(map(len, segments))} units in {n} segment{'s' * (n > 1)}: "
             f"{shown}" if segments else "no recompute"))


def vdnn_strategies(g: OpGraph, titan) -> dict[str, tuple[Strategy, str]]:
    """vDNN's and Beaumont et al.'s offloading policies as memflow.planners plans them; offloading
    all plus recomputation of block 1; an MCMC search from that."""
    rows = {f"plan.offload {p!r}": (planned(g, titan, p), PAPER[p]) for p in PAPER}
    # conv1_1, its ReLU, conv1_2: recomputing them drops the two 3.3 GB maps that vDNN_all
    # prefetches for the backward of relu1_2 (in place), where it peaks
    block1 = g.names[:g.names.index("features.3")]
    mixed = rows["plan.offload 'all'"][0].with_policy(recompute=block1)
    rows["offload all, block 1 (conv1_1..conv1_2) recomputed"] = (mixed, "")
    search = MCMCSearch(g, titan, init=mixed, seed=0, moves={"policy": 0.6, "segment": 0.4})
    search.run(iterations=SEARCH_STEPS)
    rows[f"MCMC search from the line above ({SEARCH_STEPS} steps)"] = (search.best, "")
    return rows


def vdnn() -> tuple[OpGraph, pd.DataFrame, pd.DataFrame, pd.DataFrame, dict]:
    g = memflow.zoo.graph("vgg16", batch_size=256, backend="cuda")
    titan = memflow.Cluster.preset("1xTitanX")
    ideal = Simulator(g, titan.with_memory("1TB"))
    real = Simulator(g, titan)
    keep = Strategy.single_device(g)
    t_ideal = ideal.evaluate(keep).iteration_time
    rows = {"keep all, ideal GPU": row(ideal, keep, t_ideal, "28 GB"),
            "keep all, Titan X 12 GB": row(real, keep, t_ideal, "does not fit")}
    strategies = vdnn_strategies(g, titan)
    for name, (s, paper) in strategies.items():
        rows[name] = row(real, s, t_ideal, paper)
        rows[name]["policies"] = policy_mix(s, g)
    rows["keep all, ideal GPU"]["policies"] = rows["keep all, Titan X 12 GB"]["policies"] = ""
    df = pd.DataFrame.from_dict(rows, orient="index")
    df.index.name = "VGG-16, batch 256"
    policies = {"keep all": keep, **{name: s for name, (s, _) in strategies.items()
                                     if "all" in name or "MCMC" in name}}
    return g, no_reuse_account(g), liveness_account(g, ideal, keep), df, policies


# ------------------------------------------------------------------ vDNN: measured
def _run(modules: list[nn.Module], x: torch.Tensor) -> torch.Tensor:
    for m in modules:
        x = m(x)
    return x


def vgg_layers(model: nn.Module) -> dict[str, nn.Module]:
    """VGG's forward as a chain of its units, by unit name (the flatten is ``<root>``'s)."""
    return {**{f"features.{i}": m for i, m in enumerate(model.features)},
            "avgpool": model.avgpool, ROOT: nn.Flatten(1),
            **{f"classifier.{i}": m for i, m in enumerate(model.classifier)}}


class RealStep(nn.Module):
    """A chain model under a memory policy. ``layers`` is its forward, unit name → module in
    order. Units under ``offload`` move what they save to host (numpy) memory, invisible to
    MemTracker, and back as a new tensor when backward unpacks it; each run of consecutive
    ``recompute`` units is one ``torch.utils.checkpoint(use_reentrant=False)`` segment, as
    memflow's recompute is."""

    def __init__(self, model: nn.Module, layers: dict[str, nn.Module], offload: Iterable[str],
                 recompute: Iterable[str]):
        super().__init__()
        self.model, self.offload, self.recompute = model, set(offload), set(recompute)
        self.layers = list(layers.items())
        self.paths = {**module_paths(model), **{m: name for name, m in self.layers}}
        self.stack: list[str] = []
        for m in self.paths:
            m.register_forward_pre_hook(self._enter)
            m.register_forward_hook(self._leave)
        self.weights = {t.untyped_storage().data_ptr()
                        for t in (*model.parameters(), *model.buffers())}

    def _enter(self, module: nn.Module, args: Any) -> None:
        self.stack.append(self.paths[module])

    def _leave(self, module: nn.Module, args: Any, output: Any) -> None:
        self.stack.pop()          # a forward hook that returned a value would replace the output

    def pack(self, t: torch.Tensor) -> Any:
        # a recomputed segment's own hooks are innermost: what it saves never comes here
        if self.stack and self.stack[-1] in self.offload and \
                t.untyped_storage().data_ptr() not in self.weights:
            return t.detach().numpy().copy()
        return t

    @staticmethod
    def unpack(packed: Any) -> torch.Tensor:
        return torch.from_numpy(packed).clone() if isinstance(packed, np.ndarray) else packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack):
            for recomputed, run in groupby(self.layers, lambda kv: kv[0] in self.recompute):
                mods = [m for _, m in run]
                x = checkpoint(partial(_run, mods), x, use_reentrant=False) if recomputed \
                    else _run(mods, x)
            return x


def measured(policies: dict[str, Strategy]) -> pd.DataFrame:
    """Each strategy's policies on a real CPU step at batch 2 (MemTracker) and estimated."""
    cfg = dict(batch_size=2, image_size=224, hidden=64)
    g = memflow.zoo.graph("vgg16", **cfg)
    rows = {}
    for name, full in policies.items():
        of = {p: [u for u, q in zip(full.units, full.policies) if q == p]
              for p in ("offload", "recompute")}
        s = Strategy.single_device(g).with_policy(**of)
        model, inputs = memflow.zoo.get("vgg16", device="cpu", **cfg)
        real = memtracker_peak(RealStep(model, vgg_layers(model), **of), inputs)["Total"]
        # the real step keeps offloaded images in numpy memory, which MemTracker does not
        # see, as a GPU's host memory is apart from its device's: estimated with the GPU's
        # rule (``"cuda"``: images on the host), not the CPU's (images in the CPU's own
        # memory, where export's hooks leave them); plain SGD takes no temporaries either way
        est = memflow.estimate(g, "cuda", strategy=s)
        rows[name] = {"MemTracker_MiB": real / MiB,
                      "estimate_MiB": est.loc["total", "at_peak"] / MiB,
                      "error": est.loc["total", "at_peak"] / real - 1,
                      "estimate_peak_at": est.attrs["peak_task"]}
    df = pd.DataFrame.from_dict(rows, orient="index")
    df.index.name = "VGG-16, batch 2, 224 px, CPU"
    return df


# ------------------------------------------------------------------ Chen et al.
def resnet_1001(batch: int) -> OpGraph:
    blocks = (3, 24, 303, 3)                       # 3 convolutions each: 3 * 333 + 2 = 1,001
    with torch.device("meta"):
        model = ResNet(blocks)
    return memflow.from_torch(model, torch.empty(batch, 3, 224, 224, device="meta"),
                              units="blocks", backend="cuda", name="resnet-1001")


def chen(target_gb: float = 48.0) -> tuple[OpGraph, pd.DataFrame]:
    """ResNet-1001 at the batch where keeping everything peaks at ``target_gb``; Chen's √n
    segments (a checkpoint every ⌈√n⌉ units) and ``memflow.planners.checkpoint(method="sqrt")``
    (Chen's budget walk over saved bytes) asked for the paper's 7 GB."""
    probe = resnet_1001(8)
    est = memflow.estimate(probe, "cuda").loc[:, "at_peak"]
    per_sample = est["activations"] / 8
    batch = max(1, int(round((target_gb * GB - (est["total"] - est["activations"]))
                             / per_sample)))
    g = resnet_1001(batch)
    v100 = memflow.Cluster.preset("1xV100-32GB").with_memory("1TB")
    sim = Simulator(g, v100)
    keep = Strategy.single_device(g)
    t_ideal = sim.evaluate(keep).iteration_time
    k = int(math.ceil(math.sqrt(len(g))))
    names = g.names
    rec = [u for i, u in enumerate(names) if (i + 1) % k != 0 and i < len(names) - 1]
    try:
        planned_sqrt = memflow.planners.checkpoint(g, v100, 7e9, method="sqrt")
    except memflow.planners.Infeasible as exc:     # its least peak is then the figure to print
        planned_sqrt = exc.best
    df = pd.DataFrame.from_dict({
        "keep all": row(sim, keep, t_ideal, "48 GB"),
        f"√n segments: a checkpoint every {k} of {len(g)} units":
            row(sim, keep.with_policy(recompute=rec), t_ideal, "7 GB, +30% time"),
        f"plan.checkpoint(method='sqrt'), 7 GB asked: {planned_sqrt.name}":
            row(sim, planned_sqrt, t_ideal, "7 GB, +30% time"),
    }, orient="index")
    df.index.name = f"ResNet-1001, batch {batch}"
    return g, df.drop(columns=["fits"])


# ------------------------------------------------------------------ report
def _fmt(df: pd.DataFrame) -> pd.DataFrame:
    out = df.copy()
    if "overhead" in out:
        out["overhead"] = out["overhead"].map(lambda v: f"{v:+.0%}")
    if "error" in out:
        out["error"] = out["error"].map(lambda v: f"{v:+.2%}")
    return out


def vdnn_notes(g: OpGraph, account: pd.DataFrame, live: pd.DataFrame,
               titan: pd.DataFrame) -> str:
    """The notes under the VGG-16 tables, from the figures in them."""
    total = account.loc["total", "GB"]
    over = titan.loc["plan.offload 'all'"]
    unit = over["peak_at"].split()[-1]
    u = g.units.loc[unit] if unit in g.units.index else None
    written = g.tensors[g.tensors["consumers"].map(lambda c: unit in c)
                        & (g.tensors["producer"] != unit)]["bytes"].max() / GB
    why = (f"{unit} is a {u['kind']} in place: during its backward PyTorch holds the gradient "
           f"it receives and the new one it writes ({written:.2f} GB each; the second is the "
           f"unit's bwd_tmp_bytes), the output it saved, brought back from the host, and the "
           "input of the unit before it, prefetched one unit ahead as vDNN does. "
           if u is not None and u["bwd_tmp_bytes"] > 0 else "")
    lowest = titan.loc[titan.index.str.startswith("plan.offload"), "peak_GB"].min()
    fits = titan[titan["fits"] & (titan.index != "keep all, ideal GPU")]
    fastest = fits.loc[fits["overhead"].idxmin()] if len(fits) else None
    best = (f"**Fastest plan that fits the Titan X: {fastest.name}**, "
            f"{fastest['peak_GB']:.2f} GB at {fastest['overhead']:+.0%} against the ideal GPU "
            f"(vDNN_dyn: 18%); it does {fastest['policies']}." if fastest is not None else
            "**No plan above fits the Titan X.**")
    return (
        f"**Why 28 GB and {live.loc['total', 'GB']:.1f} GB differ.** vDNN's baseline allocates "
        "every layer's X, Y, dX, dY (and cuDNN workspace) for the whole step; counted from the "
        f"graph that is {total:.1f} GB without workspace ({total / 28 - 1:+.0%} from the "
        "paper's 28 GB, whose exact rules this account does not reproduce). memflow follows "
        "PyTorch: a gradient map lives only from its last reader's backward to its producer's "
        "backward, so few are alive at the peak; PyTorch also keeps the int64 max-pool "
        "indices, which cuDNN's pooling does not.\n\n"
        f"**Where offloading everything peaks: {over['peak_at']}**, "
        f"{over['activations_GB']:.2f} GB of activations and {over['transient_GB']:.2f} GB of "
        f"activation gradients, {over['peak_GB']:.2f} GB in all. {why}No choice of what to "
        f"offload gets lower (the least peak of plan.offload's policies is {lowest:.2f} GB); "
        "recomputing block 1 removes the two prefetched maps, and the search then gives back offloads whose "
        f"copies stall the step. {best}\n\n"
        "Simulated: time model of docs/data-model.md, fp32, SGD, captured with CUDA's rules; "
        "'ideal' is the same GPU with unbounded memory keeping everything; a Titan X has "
        "12 GiB (12.88 GB). 'peak_at' is the compute task running at the peak; the categories "
        "are the memory held then.")


def check_notes() -> str:
    return ("The real step copies offloaded tensors at pack time and brings them back only "
            "when backward needs them (no prefetch ahead), as memflow.estimate's program "
            "order does; recomputed runs are torch.utils.checkpoint segments.")


def chen_notes(g: OpGraph, resnet: pd.DataFrame) -> str:
    """The line under the ResNet table: what of the √n peak is not activations."""
    keep, uniform, planned = (resnet.iloc[i] for i in range(3))
    weights = g.units["param_bytes"].sum() / GB
    act = planned["activations_GB"] + planned["transient_GB"]
    return (
        f"**Gap to 7 GB.** Of the planned √n peak ({planned['peak_GB']:.2f} GB, at "
        f"{planned['peak_at']}), {weights:.2f} GB are the fp32 weights of "
        f"{weights * GB / 4 / 1e6:.0f} M parameters and "
        f"{planned['weights+grads_GB'] - weights:.2f} GB weight gradients made so far; saved "
        f"activations and activation gradients are {act:.2f} GB, "
        f"{act / (keep['activations_GB'] + keep['transient_GB']):.0%} of keeping everything. "
        f"Time: +{planned['overhead']:.0%} (one more forward of every recomputed unit). "
        f"A checkpoint every ⌈√n⌉ units ({uniform['peak_GB']:.2f} GB) holds more because "
        "units of the early, high-resolution stages save more: Chen's walk over saved bytes "
        "evens the segments out. Batch: keeping everything peaks at "
        f"{keep['peak_GB']:.1f} GB (paper: 48 GB).")


def main() -> None:
    g, account, live, titan, policies = vdnn()
    check = measured(policies)
    resnet_graph, resnet = chen()
    for df in (account, live, titan, check, resnet):
        print(df.to_string(), "\n")
    notes = vdnn_notes(g, account, live, titan), chen_notes(resnet_graph, resnet)
    print("\n\n".join(notes))
    body = "\n\n".join([
        "### VGG-16 at batch 256: vDNN's account and memflow's peak",
        table(account, floatfmt=".2f"), table(live, floatfmt=".2f"),
        "### VGG-16 at batch 256 on a Titan X (12 GiB)", table(_fmt(titan), floatfmt=".3g"),
        notes[0],
        "### The memory model where those peaks are: real CPU step (MemTracker) vs estimate",
        table(_fmt(check), floatfmt=".1f"), check_notes(),
        "### Chen et al.: a 1,000-layer ResNet, √n checkpointing",
        table(_fmt(resnet), floatfmt=".3g"), notes[1]])
    write_section("bench_seeds", body,
                  title="Seeds' cases: vDNN offloading and √n checkpointing")


if __name__ == "__main__":
    main()
