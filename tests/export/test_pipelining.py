"""Pipeline stages across processes (torch.distributed.pipelining, gloo on CPU): one step of a
staged strategy gives the single-process loss and gradients, GPipe and 1F1B, with memory
policies inside the stages; the rules that refuse a strategy name the unit."""
import copy

import pytest
import torch
import torch.nn.functional as F

import memflow
from memflow import zoo
from memflow.errors import ExportError
from memflow.export import apply, held_bytes
from memflow.export.rank_measure import state_bytes
from memflow.export.pipelining import build_pipeline, split_points, stage_modules, stage_ranks
from memflow.strategy import Strategy
from memflow.strategy.runnable import unrunnable

from gloo_ranks import gathered, run_ranks

GPT2 = dict(n_layer=2, hidden=16, n_head=2, vocab=40, seq_len=6, dropout=0.0)
RESNET = dict(num_classes=5, width=4, image_size=32, blocks=(1, 2, 1, 1))
LLAMA = dict(vocab=40, hidden=16, n_layer=2, n_head=4, n_kv_head=2, ffn=24, seq_len=6)


def mse(output, target):
    return F.mse_loss(output.float(), target)


def _inputs(name, batch, options):
    model, inputs = zoo.get(name, batch, device="cpu", seed=0, **options)
    return model, inputs if isinstance(inputs, tuple) else (inputs,)


def _worker(rank, cases):
    """Every case's strategy under both schedules on this rank: {(case, schedule): (loss or
    None, {name: full gradient})}; a sharded gradient is gathered over the stage's replicas,
    a tensor-parallel one over its group.
    ``cases``: {case: (model name, options, batch, strategy dict, target[, schedules])}."""
    out = {}
    for case, (name, options, batch, doc, target, *schedules) in cases.items():
        replicas = int(Strategy.from_dict(doc).sample[0])
        replica = rank // (torch.distributed.get_world_size() // replicas)
        model, args = _inputs(name, batch, options)
        share = batch // replicas
        args = tuple(a[replica * share:(replica + 1) * share] for a in args)
        target = target[replica * share:(replica + 1) * share]
        for schedule in (schedules or [("gpipe", "1f1b")])[0]:
            s = Strategy.from_dict(doc).with_schedule(schedule=schedule)
            run = build_pipeline(copy.deepcopy(model), s, (args, {}), rank=rank, loss_fn=mse)
            loss = run.step(args, {}, target)
            grads = {n: getattr(p.grad, "full_tensor", p.grad.clone)().float()
                     for n, p in run.module.named_parameters()}
            out[case, schedule] = (loss, grads)
    return out


def _reference(name, options, batch, strategy, dtype=None):
    """Loss and gradients of the single-process original: ``apply`` runs the same
    micro-batches (GPipe in one process) and memory policies; in ``dtype``, parameters and
    floating inputs are cast to it."""
    model, args = _inputs(name, batch, options)
    if dtype is not None:
        model.to(dtype)
        args = tuple(a.to(dtype) if a.is_floating_point() else a for a in args)
    one = Strategy(strategy.units, devices=[("gpu0",)] * len(strategy), policy=strategy.policy,
                   microbatches=strategy.microbatches, schedule="gpipe")
    exported = apply(model, one, devices={"gpu0": "cpu"})
    out = exported(*args)
    torch.manual_seed(1)
    target = torch.randn(out.shape)
    loss = mse(out, target)
    loss.backward()
    return loss.detach(), target, {n.removeprefix("module."): p.grad.float()
                                   for n, p in exported.named_parameters()}


@pytest.mark.slow       # spawns 2 processes (each imports torch and memflow)
@pytest.mark.parametrize("name, options, policies", [
    ("gpt2", GPT2, {"recompute": ["wte", "wpe", "<root>#2"], "offload": ["ln_f"]}),
    ("resnet50", RESNET, {"recompute": ["layer1.0", "layer2.0"], "offload": ["fc"]}),
])
def test_two_stages_match_one_process(name, options, policies, tmp_path):
    batch = 4
    graph = memflow.zoo.graph(name, batch_size=batch, units="blocks", **options)
    s = Strategy.pipeline(graph, 2, stages=2, microbatches=2).with_policy(**policies)
    loss, target, reference = _reference(name, options, batch, s)
    ranks = run_ranks(_worker, 2, tmp_path, {"": (name, options, batch, s.to_dict(), target)})
    for schedule in ("gpipe", "1f1b"):
        assert ranks[0]["", schedule][0] is None            # the loss lives on the last stage
        torch.testing.assert_close(ranks[1]["", schedule][0], loss, rtol=1e-5, atol=1e-6)
        grads = gathered([r["", schedule][1] for r in ranks], _inputs(name, batch, options)[0])
        assert grads.keys() == reference.keys(), schedule
        for n in reference:
            torch.testing.assert_close(grads[n], reference[n], rtol=1e-4, atol=1e-6,
                                       msg=f"{schedule} {n}")


@pytest.mark.slow       # spawns 4 processes, once for every case
def test_replicas_of_a_pipeline_shard_cast_and_average_their_gradients(tmp_path):
    """dp2 × pp2: each stage replicated over its data-parallel group — averaged by hand, FSDP2
    ``fully_shard`` (ZeRO-3 and ZeRO-2) beside ZeRO-1, bf16 with FSDP2's mixed precision and
    fp32 masters, the optimizer on the host, and GPT-2's embedding and head, tied across the
    stages, sharded — as torchtitan composes dp × pp; and pp2 × tp2, Llama's decoder layers
    split inside the stages, as it composes pp × tp."""
    options, batch = {"n": 4, "width": 16, "kind": "residual"}, 8
    llama = memflow.zoo.graph("tinyllama-1.1b", batch_size=batch, units="blocks", **LLAMA)
    graph = memflow.zoo.graph("chain", batch_size=batch, units="blocks", **options)
    names = graph.names
    s = Strategy.pipeline(graph, 4, stages=2, microbatches=2, dp=2).with_policy(
        recompute=names[:1])
    assert stage_ranks(s) == {"gpu0": 0, "gpu1": 1, "gpu2": 2, "gpu3": 3}
    gpt2 = memflow.zoo.graph("gpt2", batch_size=batch, units="blocks", **GPT2)
    cases = {
        "replicated": ("chain", options, graph, s),
        "fsdp": ("chain", options, graph, s.with_shard(
            {names[0]: "parameters", names[1]: "optimizer", names[2]: "gradients",
             names[3]: "parameters"})),
        "bf16": ("chain", options, graph, s.with_shard(
            {names[0]: "parameters", names[3]: "parameters"}).with_model_states(
            precision="bf16", offload_optimizer=[names[0], names[2]])),
        "gpt2 fsdp": ("gpt2", GPT2, gpt2, Strategy.pipeline(
            gpt2, 4, stages=2, microbatches=2, dp=2).with_policy(recompute=["h.0"]).with_shard(
            "parameters")),
        # pp2 × tp2: Llama's embedding, decoder layers, norm and head split inside the stages
        # (grouped-query attention by heads, SwiGLU by ffn rows), tensor parallelism in stages
        "llama tp": ("tinyllama-1.1b", LLAMA, llama, Strategy.tensor_parallel(
            llama, 4, tp=2, pp=2, microbatches=2).with_config(
            "norm", parameter=1, devices=["gpu3"]).with_policy(recompute=["norm"])),
    }
    expected, docs = {}, {}
    for case, (name, opts, g, strategy) in cases.items():
        assert unrunnable(strategy.with_schedule(schedule="1f1b"), g) is None, case
        assert unrunnable(strategy.with_schedule(schedule="gpipe"), g) is None, case
        loss, target, reference = _reference(name, opts, batch, strategy)
        if strategy.precision == "bf16":    # bf16's own rounding: the single process in bf16
            # is as far from fp32 (10% of the largest element on layers.2.fc1) as the pipeline
            reference = _reference(name, opts, batch, strategy, torch.bfloat16)[2]
        expected[case] = loss, reference
        # each trace costs seconds: bf16 and GPT-2 under one schedule each
        docs[case] = (name, opts, batch, strategy.to_dict(), target,
                      {"bf16": ("gpipe",), "gpt2 fsdp": ("1f1b",), "llama tp": ("1f1b",)}.get(
                          case, ("gpipe", "1f1b")))
    ranks = run_ranks(_worker, 4, tmp_path, docs)
    for case, schedule in ranks[0]:
        name, opts, _, strategy = cases[case]
        bf16 = strategy.precision == "bf16"
        loss, reference = expected[case]
        losses = [r[case, schedule][0] for r in ranks if r[case, schedule][0] is not None]
        torch.testing.assert_close(torch.stack(losses).mean(), loss,
                                   rtol=2e-2 if bf16 else 1e-5, atol=1e-6)
        for replica in (ranks[:2], ranks[2:]) if strategy.sample[0] == 2 else (ranks,):
            # each replica holds the averaged gradients
            grads = gathered([r[case, schedule][1] for r in replica], _inputs(name, batch,
                                                                            opts)[0])
            assert grads.keys() == reference.keys(), (case, schedule)
            for n, want in reference.items():
                scale = float(want.abs().max()) + 1e-8
                torch.testing.assert_close(grads[n], want, rtol=0.05 if bf16 else 1e-4,
                                           atol=0.05 * scale if bf16 else 1e-6,
                                           msg=f"{case} {schedule} {n}")


def test_stages_chain_to_the_model_and_run_their_memory_policies():
    graph = memflow.zoo.graph("gpt2", batch_size=4, units="blocks", **GPT2)
    s = Strategy.pipeline(graph, 2, stages=2, microbatches=2)
    model, args = _inputs("gpt2", 4, GPT2)
    kept, tied = stage_modules(model, s, (args, {}))
    assert tied == [{"submod_pp_0": "wte.weight", "submod_pp_1": "lm_head.weight"}]
    micro = args[0][:2]
    torch.testing.assert_close(kept[1](kept[0](micro)), model(micro))
    recomputed, _ = stage_modules(model, s.with_policy(recompute=["h.0"]), (args, {}))
    assert held_bytes(recomputed[0], micro)["cpu"] < held_bytes(kept[0], micro)["cpu"]


def test_a_stage_holds_the_weights_and_buffers_predicted_for_its_device():
    """The tracer leaves gpt2's causal mask on stage 0 as a plain attribute, not a buffer:
    the rank holds it all the same, and the simulator charges it there."""
    graph = memflow.zoo.graph("gpt2", batch_size=4, units="blocks", **GPT2)
    s = Strategy.pipeline(graph, 2, stages=2, microbatches=2)
    model, args = _inputs("gpt2", 4, GPT2)
    stages_, _ = stage_modules(model, s, (args, {}))
    states = memflow.simulate(graph, s, memflow.Cluster.preset("4xV100-16GB")).model_states
    for device, i in stage_ranks(s).items():
        stage = stages_[i]
        assert state_bytes(stage, torch.optim.SGD(stage.parameters()))["weights"] == \
            states.at[device, "weights"], device


def test_cuts_fall_at_module_calls():
    graph = memflow.zoo.graph("gpt2", batch_size=2, units="blocks", **GPT2)
    s = Strategy.pipeline(graph, 2, stages=2, microbatches=2)
    assert split_points(s, graph) == {"h.1": "beginning"}
    glue = s.with_config({"<root>#2": {"stage": 1}, "h.0": {"stage": 1}})
    assert split_points(glue, graph) == {"wpe": "end"}
    units = ["<root>", "a", "<root>#2", "<root>#3"]
    inside = Strategy(units, devices=[("gpu0",)] * 3 + [("gpu1",)], stage=[0, 0, 0, 1])
    with pytest.raises(ExportError, match="unit '<root>#3' starts stage 1 after unit "
                                          "'<root>#2', but neither is a module called once"):
        split_points(inside)


def test_a_stage_on_two_devices_or_split_is_refused():
    units = ["a", "b"]
    shared = Strategy(units, devices=[("gpu0",), ("gpu0",)], stage=[0, 1])
    with pytest.raises(ExportError, match="unit 'b': device 'gpu0' runs stage 1 of replica 0"):
        stage_ranks(shared)
    split = Strategy(units, devices=[("gpu0",), ("gpu1", "gpu2")], parameter=[1, 2],
                     stage=[0, 1])
    with pytest.raises(ExportError, match="stage 0 .unit 'a'. has no split unit but other "
                                          "stages are split 2 ways"):
        stage_ranks(split)
    # a tensor-parallel group per stage: rank (stage * 2 + k) is device k of its group
    both = split.with_config("a", parameter=2, devices=["gpu0", "gpu3"])
    assert stage_ranks(both) == {"gpu0": 0, "gpu3": 1, "gpu1": 2, "gpu2": 3}
    attribute = Strategy(units, devices=[("gpu0",), ("gpu1", "gpu2")], attribute=[1, 2],
                         stage=[0, 1])
    with pytest.raises(ExportError, match="unit 'b' is split over its attribute dimension"):
        stage_ranks(attribute)


def test_micro_batches_must_divide_the_batch():
    model, args = _inputs("chain", 6, {"n": 2, "width": 8})
    s = Strategy(["layers.0", "layers.1"], devices=[("gpu0",), ("gpu1",)], stage=[0, 1],
                 microbatches=4)
    with pytest.raises(ExportError, match="4 micro-batches do not divide the replica's batch "
                                          "of 6"):
        build_pipeline(copy.deepcopy(model), s, (args, {}), rank=0, loss_fn=mse)
