"""Search space = export space (issue 14): every strategy the search's moves reach — any move,
pins included, from a data-parallel start or a projected baseline — on a CNN, a transformer,
the chain and Llama's decoder layers (blocks, split as Megatron blocks) over 1, 2 and 4 devices
is one export runs: ``memflow.export.apply`` takes it (and ``script`` writes it, and one step
trains), never refusing, and a sequence-parallel one is taken by the tensor-parallel path, the
one that runs it; and a sample of them — bf16 pipelines of a ResNet and a Llama, sequence
parallel blocks of GPT-2 and Llama among them — runs on its processes, one step giving the
single-process original's loss."""
from __future__ import annotations

import functools
import importlib.util

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import memflow
from memflow import zoo
from memflow.export import apply, script
from memflow.export.accumulation import accumulates
from memflow.export.multiprocess import process_path, processes
from memflow.search.initial import data_parallel
from memflow.search.moves import DEFAULT_WEIGHTS, MOVES
from memflow.search.space import SearchSpace
from memflow.strategy.runnable import unrunnable

from gloo_ranks import run_scripts

BATCH = 8
MODELS = {
    "resnet50": dict(num_classes=5, width=4, image_size=32, blocks=(1, 1, 1, 1)),
    # no dropout: a run's loss is compared with one process's
    "gpt2": dict(vocab=40, max_positions=16, hidden=16, n_layer=1, n_head=2, seq_len=6,
                 dropout=0.0),
    "chain": dict(n=3, width=8),
    "tinyllama-1.1b": dict(vocab=40, hidden=16, n_layer=2, n_head=4, n_kv_head=2, ffn=24,
                           seq_len=6),
}
UNITS = {"tinyllama-1.1b": "blocks"}     # decoder layers, split as Megatron blocks
CLUSTERS = ("1xV100-16GB", "2xV100-16GB", "4xV100-16GB")
TENSOR_STEPS = 3
"""Proposals of the walks from tensor and sequence parallelism that must keep the latter."""


@functools.cache
def graph(model: str, units: str | None = None):
    return zoo.graph(model, batch_size=BATCH, units=units or UNITS.get(model, "leaves"),
                     **MODELS[model])


@functools.cache
def meta_model(model: str):
    return zoo.get(model, batch_size=BATCH, **MODELS[model])[0]


def _steps(s, space, rng, steps: int):
    # the default search's moves: the opt-in micro-batch move (MICROBATCH_WEIGHTS) drew a
    # resnet50 bf16 pipeline of 2-sample micro-batches whose loss (batch norms over 2 samples
    # in bf16) was 4.0% off the fp32 reference, while the same strategy in fp32 matched it to
    # 2e-6 and with 4-sample micro-batches bf16 was within 0.5%: rounding, not export; its
    # proposals are checked to run in tests/search/test_descent.py
    names = list(DEFAULT_WEIGHTS)
    for _ in range(steps):
        prop = MOVES[names[int(rng.integers(len(names)))]](rng, s, space)
        if prop is not None:
            s = prop.strategy
    return s


def walk(model: str, cluster: str, seed: int, steps: int, pins: int, pipeline: bool = False,
         units: str | None = None, tensor: bool = False):
    """A random walk of ``steps`` proposals (each taken) in the default search space, from
    data parallelism, from a walk in FlexFlow's full space (per-unit sample degrees,
    attribute splits, 1F1B micro-batches) projected into it, as the search projects its
    starts and offers (or, with ``pipeline``, from a projected 1F1B pipeline; with
    ``tensor``, from Megatron's tensor and sequence parallelism over two devices, projected)."""
    g, c = graph(model, units), memflow.Cluster.preset(cluster)
    space = SearchSpace(g, c)
    rng = np.random.default_rng(seed)
    s = data_parallel(g, c)
    if tensor and len(c.devices) > 1:
        s = space.project(memflow.Strategy.tensor_parallel(
            g, c, tp=2, dp=len(c.devices) // 2, sequence_parallel=True))
    elif pipeline and len(c.devices) > 1:     # a 1F1B pipeline, kept where export runs it
        n = 2 if len(c.devices) == 2 or rng.integers(2) else 4
        s = space.project(memflow.Strategy.pipeline(g, c, stages=n, microbatches=n,
                                                    dp=len(c.devices) // n, schedule="1f1b"))
    elif rng.integers(3) == 2 and len(c.devices) > 1:   # per-unit sample degrees: a tail
        cut = int(rng.integers(1, space.n))                # of units on half the devices
        half = s.devices[0][:len(c.devices) // 2]
        s = space.project(s.with_config(s.units[cut:], sample=len(half), devices=half))
    elif rng.integers(2):
        full = SearchSpace(g, c, runnable=False)
        s = _steps(s.with_schedule(microbatches=2, schedule="1f1b"), full, rng, steps)
        s = space.project(s)
    space.pinned[rng.choice(space.n, size=min(pins, space.n), replace=False)] = True
    return g, _steps(s, space, rng, steps)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(MODELS)), st.sampled_from(CLUSTERS), st.integers(0, 10**6),
       st.integers(1, 40), st.integers(0, 2), st.sampled_from(("data", "pipeline", "tensor")))
def test_every_proposal_exports(model, cluster, seed, steps, pins, start):
    g, s = walk(model, cluster, seed, steps, pins, start == "pipeline",
                tensor=start == "tensor")
    assert unrunnable(s, g) is None
    exported = apply(meta_model(model), s, g,       # refuses with ExportError otherwise
                     devices={d: "meta" for d in s.device_names})
    assert len(exported.devices) == len(g)
    if (s.schedule == "1f1b" and s.microbatches > 1 and not accumulates(s)) or (
            s.stage.max() > 0 and _stage_states(s)):
        # 1F1B with stages runs across processes (with one stage, in each replica's loop),
        # and so do stages that shard, cast or offload their model states
        assert process_path(s, meta_model(model), g) == "pipeline"
    if (s.sample != s.sample[0]).any():     # per-unit degrees: a process per device
        assert process_path(s, meta_model(model), g) == "sample"
    if s.sequence_parallel.any():     # the path that runs sequence parallelism takes it
        assert process_path(s, meta_model(model), g) == "tensor"


def _stage_states(s) -> bool:
    """Whether ``s``'s model states are sharded over replicas, bf16 or stepped on the host."""
    return bool((s.sample[0] > 1 and (s.shard > 0).any()) or s.precision in ("bf16", "pure-bf16")
                or s.offload_optimizer.any())


def test_walks_reach_every_feature():
    """The walks above do split parameters and change the data-parallel degree (else the
    property would hold vacuously)."""
    seen = {"parameter": set(), "replicas": set(), "1f1b stages": set(), "mixed": set(),
            "accumulation": set(), "stage states": set(), "block split": set(),
            "sequence": set()}
    # 60 seeds: a parameter degree of 4 comes in ~1 walk of 35 (seeds 30-69: 5 of 160 walks
    # before amp was runnable, 4 now that amp on these V100s proposes whole-model replicas);
    # amp changed the random streams, and only seed 56 below 60 reaches it now
    for seed in range(60):
        for model in MODELS:
            g, s = walk(model, "4xV100-16GB", seed, 40, 0)
            seen["parameter"].add(int(s.parameter.max()))
            if model in UNITS:      # a Megatron block (a decoder layer) split
                blocks = g.units["tensor_degree"].to_numpy() > 0
                seen["block split"].add(bool((s.parameter[blocks] > 1).any()))
                # sequence parallelism is short-lived in a walk: a policy move recomputing
                # or offloading a split unit, or a part moved off the group, drops it
                _, sp = walk(model, "2xV100-16GB", seed, TENSOR_STEPS, 0, tensor=True)
                seen["sequence"].add(bool(sp.sequence_parallel.any()))
            seen["replicas"].add(int(s.sample[0]))
            seen["accumulation"].add(accumulates(s))   # 1F1B with one stage, kept as it is
            # a short walk: the replicas move sets one degree for all units again
            _, short = walk(model, "4xV100-16GB", seed, 4, 0)
            seen["mixed"].update({bool((x.sample != x.sample[0]).any()) for x in (s, short)})
            _, s = walk(model, "4xV100-16GB", seed, 40, 0, pipeline=True)
            if s.schedule == "1f1b" and s.microbatches > 1:
                seen["1f1b stages"].add(int(s.stage.max()) + 1)
            if s.stage.max() > 0:
                seen["stage states"].add(_stage_states(s))
    assert seen["parameter"] >= {1, 2, 4} and seen["replicas"] == {1, 2, 4}
    assert seen["1f1b stages"] >= {2}       # 1F1B pipelines are walked, not only projected
    assert seen["mixed"] == {False, True}   # per-unit sample degrees are walked too
    assert seen["accumulation"] == {False, True}    # and gradient accumulation
    assert True in seen["stage states"]     # and stages sharding, casting or offloading
    assert True in seen["block split"]      # and Megatron blocks split
    assert True in seen["sequence"]         # and sequence parallel


@pytest.mark.parametrize("model", sorted(MODELS))
def test_walk_scripts_and_trains(model, tmp_path):
    """A walked strategy on two devices: ``script`` writes it, and one replica's real step
    gives a finite loss and gradients for every parameter."""
    g, s = walk(model, "2xV100-16GB", 7, 40, 0)
    path = script(s, tmp_path / "train.py", model=model, model_options=MODELS[model],
                  batch_size=BATCH, graph=g)
    real, inputs = zoo.get(model, batch_size=BATCH // int(s.sample[0]), device="cpu",
                           **MODELS[model])
    # one process per replica, or per stage or tensor shard where the script runs across them
    nproc = processes(s, process_path(s, real, g))
    assert f"--nproc_per_node {nproc}" in path.read_text()
    exported = apply(real, s, g)
    loss = exported(*inputs).float().pow(2).mean()
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None for p in exported.parameters() if p.requires_grad)


def test_a_search_started_anywhere_stays_runnable():
    """MCMCSearch projects a start export cannot run (a 1F1B pipeline, a tensor-parallel
    block split) into the space, keeps its proposals there, and runnable=False keeps
    FlexFlow's full space for research."""
    g, c = graph("gpt2"), memflow.Cluster.preset("4xV100-16GB")
    # a 1F1B pipeline with fewer micro-batches than stages (torch's Schedule1F1B refuses it)
    for start in (memflow.Strategy.pipeline(g, c, stages=4, microbatches=2),
                  memflow.Strategy.tensor_parallel(g, c, tp=4)):
        assert unrunnable(start, g) is not None
        search = memflow.MCMCSearch(g, c, init=start, seed=1).run(iterations=40)
        assert unrunnable(search.best, g) is None and unrunnable(search.current, g) is None
    full = memflow.MCMCSearch(g, c, init=start, seed=1, runnable=False)
    assert full.current == start


RUN_CLUSTER = "2xA100-80GB"     # bf16 units: the precision move offers bf16 there
WALK_SEEDS = 60
"""Seeds tried per entry: with amp among the precisions (a pipeline's amp turns it into whole
replicas) a bf16 pipeline of resnet50's blocks is first reached at a seed past 20."""
RUNS = {    # what the sample must hold: (model, units, what) -> test of (strategy, path)
    # the bottleneck blocks as units: a cut among a ResNet's leaves falls before an in-place
    # ReLU as often as not, which a pipeline stage cannot start with (strategy.process_paths)
    ("resnet50", "blocks", "bf16 pipeline"):
        lambda s, path: path == "pipeline" and s.precision == "bf16",
    ("tinyllama-1.1b", "blocks", "bf16 pipeline"):
        lambda s, path: path == "pipeline" and s.precision == "bf16",
    ("tinyllama-1.1b", "blocks", "tensor-parallel blocks"):
        lambda s, path: path == "tensor" and not s.sequence_parallel.any(),
    ("tinyllama-1.1b", "blocks", "sequence-parallel blocks"):
        lambda s, path: path == "tensor" and s.sequence_parallel.any(),
    ("gpt2", "blocks", "sequence-parallel blocks"):
        lambda s, path: path == "tensor" and s.sequence_parallel.any(),
    # the first such walk recomputes layer2.0 and layer3.0 selectively, layer3.0 a
    # fully_shard group of its own: two segments (Strategy.segment), as FSDP2 needs
    ("resnet50", "blocks", "replicas"): lambda s, path: path is None and s.sample[0] == 2,
}


def drawn() -> dict:
    """For each entry of :data:`RUNS`, the first walk (seeds in order, from data parallelism,
    from a pipeline, and :data:`TENSOR_STEPS` proposals from tensor parallelism) on two
    devices that has it and runs on two processes: strategies the search's own moves reach,
    drawn deterministically."""
    out = {}
    for (model, units, what), wanted in RUNS.items():
        for seed in range(WALK_SEEDS):
            g, s = next(((g, s) for g, s in (walk(model, RUN_CLUSTER, seed, steps, 0, pipe,
                                                  units, tensor=start)
                                             for pipe, start, steps in (
                                                 (False, False, 40), (True, False, 40),
                                                 (False, True, TENSOR_STEPS)))
                         if processes(s, p := process_path(s, meta_model(model), g)) == 2
                         and wanted(s, p)), (None, None))
            if s is not None:
                out[model, what] = g, s
                break
        else:
            raise AssertionError(f"no walk of {model} on {RUN_CLUSTER} reaches {what}")
    return out


def _reference(path, model: str, s) -> float:
    """The loss of the single-process original for the exported script ``path``: each
    replica's batch and target (as the script draws them) through rank 0's weights, in its
    micro-batches (batch norms see the micro-batches the stages see), averaged."""
    spec = importlib.util.spec_from_file_location("reference_script", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    replicas = int(s.sample[0])
    share = BATCH // replicas
    original = module.build_model(model, share, MODELS[model], device="cpu", seed=0)[0]
    losses = []
    for r in range(replicas):
        inputs = module.build_model(model, share, MODELS[model], device="cpu", seed=r)[1]
        args, _ = module.as_args(inputs)
        with torch.no_grad():
            out = torch.cat([original(*part) for part in zip(
                *(a.tensor_split(s.microbatches) for a in args))])
        losses.append(module.loss_of("auto", out, None, 1000 + r)[0])
    return float(torch.stack(losses).mean())


@pytest.mark.slow       # one launch of 2 processes, every drawn strategy in turn
def test_walked_strategies_run_on_their_processes(tmp_path):
    """Search space = export space, run: walked strategies (bf16 pipelines of a ResNet and a
    Llama, Llama's blocks split over tensor-parallel ranks, with and without sequence
    parallelism, GPT-2's blocks sequence parallel, ResNet replicas) exported and run
    by their scripts on gloo, two processes each, one step; the loss is the single-process
    original's (bf16: within bf16's rounding)."""
    cases = drawn()
    paths, expected = [], []
    for k, ((model, what), (g, s)) in enumerate(cases.items()):
        assert unrunnable(s, g) is None, what
        path = script(s, tmp_path / f"train{k}.py", model=model, model_options=MODELS[model],
                      batch_size=BATCH, graph=g)
        paths.append(path)
        expected.append(_reference(path, model, s))
    losses = run_scripts(paths, 2, tmp_path, ["--steps", "1"])
    for ((model, what), (_, s)), got, want in zip(cases.items(), losses, expected):
        bf16 = s.precision in ("bf16", "pure-bf16")
        assert got[0] == pytest.approx(want, rel=2e-2 if bf16 else 1e-4), (model, what,
                                                                            s.precision)


def test_a_stage_cannot_start_by_writing_its_input_in_place():
    """A ResNet cut between a batch norm and its in-place ReLU: the stage would write the
    activation it receives, a leaf that requires grad, which autograd refuses; a cut one unit
    later runs."""
    g = graph("resnet50")
    s = memflow.Strategy.pipeline(g, 2, stages=2, microbatches=2, schedule="1f1b")
    cut = g.names.index("layer1.0.relu2")

    def cut_at(k: int):
        return s.with_config({u: {"stage": int(i >= k), "devices": [f"gpu{int(i >= k)}"]}
                              for i, u in enumerate(g.names)})
    assert "unit 'layer1.0.relu2' starts a new stage or group and writes its input in place" \
        in unrunnable(cut_at(cut), g)
    assert unrunnable(cut_at(cut + 1), g) is None
