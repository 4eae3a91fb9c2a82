"""Tensor parallelism across processes (DTensor, gloo on CPU): one step of a strategy with
parameter splits gives the single-process loss and gradients (gathered to full tensors): a
CNN's classifier (a Megatron pair and a gathered column split) and GPT-2 (embeddings, a
Megatron MLP pair, gathered attention projections, a tied head, whole blocks split, with and
without sequence parallelism) and Llama (its decoder layers split: grouped-query attention by
heads, the SwiGLU MLP by ffn rows; with and without sequence parallelism)."""
import pytest
import torch
import torch.nn.functional as F

import memflow
from memflow import zoo
from memflow.errors import ExportError
from memflow.export.pipelining import average_gradients
from memflow.export.tensor_parallel import full_gradients, parallelize, tensor_plan, tensor_ranks
from memflow.strategy import Strategy
from memflow.zoo.llama import TINY_ARCH

from gloo_ranks import gathered, run_ranks

GPT2 = dict(n_layer=2, hidden=16, n_head=2, vocab=40, seq_len=6, dropout=0.0)
ALEXNET = dict(num_classes=6, hidden=16, image_size=64, dropout=0.0)
LLAMA = {**TINY_ARCH, "seq_len": 6}


def mse(output, target):
    return F.mse_loss(output.float(), target)


def _model(name, options, batch=4):
    model, inputs = zoo.get(name, batch, device="cpu", seed=0, **options)
    return model, inputs if isinstance(inputs, tuple) else (inputs,)


def _graph(name, options, units):
    return memflow.zoo.graph(name, batch_size=4, units=units, **options)


def _split(graph, units, tp=2):
    devices = tuple(f"gpu{t}" for t in range(tp))
    return Strategy.single_device(graph).with_config(
        {u: {"parameter": tp, "devices": devices} for u in units})


def _worker(rank, cases):
    """Per ``(model, options, units, strategy document, target)``: the loss and full gradients
    of one step."""
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),))
    out = []
    for name, options, units, doc, target in cases:
        model, args = _model(name, options)
        exported = parallelize(model, Strategy.from_dict(doc), mesh, _graph(name, options, units))
        widths = []         # the sequence length a block sees (sequence parallelism: a part)
        second = {"gpt2": "h.1", "tinyllama-1.1b": "layers.1"}.get(name)
        if second:
            model.get_submodule(second).register_forward_pre_hook(
                lambda m, a: widths.append(a[0].shape[1]))
        loss = mse(exported(*args), target)
        loss.backward()
        out.append((loss.detach(), full_gradients(exported), widths))
    return out


# launch: [(model, options, units, split units or "constructor", policies)], one launch each
CASES = {
    "alexnet": [("alexnet", ALEXNET, "leaves", ["classifier.1", "classifier.4", "classifier.6"],
                 {"recompute": ["features.0", "features.1"], "offload": ["classifier.2"]})],
    "transformers": [
        ("gpt2", GPT2, "leaves", ["wte", "wpe", "h.0.attn.qkv", "h.0.attn.proj", "h.0.mlp.fc",
                                  "h.0.mlp.proj", "h.1.mlp.fc"],
         {"recompute": ["h.0.ln_1", "h.0.attn.qkv"], "offload": ["h.1.mlp.act"]}),
        # Strategy.tensor_parallel: whole blocks, embeddings and ln_f split
        ("gpt2", GPT2, "blocks", "constructor", {"recompute": ["lm_head"],
                                                  "offload": ["<root>#2"]}),
        # and with sequence parallelism (blocks and ln_f on sequence parts)
        ("gpt2", GPT2, "blocks", "sequence", {"recompute": ["lm_head"]}),
        # Llama decoder layers: grouped-query attention by heads, the SwiGLU MLP by ffn rows
        ("tinyllama-1.1b", LLAMA, "blocks", "constructor", {"recompute": ["norm"]}),
        # and with sequence parallelism: the rotary cos and sin stay whole on every rank
        ("tinyllama-1.1b", LLAMA, "blocks", "sequence", {"recompute": ["lm_head"]})],
}


def _strategy(name, options, units, split, policies):
    graph = _graph(name, options, units)
    s = (Strategy.tensor_parallel(graph, 2, tp=2, sequence_parallel=split == "sequence")
         if split in ("constructor", "sequence") else _split(graph, split))
    return s.with_policy(**policies)


def _reference(name, options):
    """The single process: its model after one step (gradients set), loss and target."""
    model, args = _model(name, options)
    out = model(*args)
    torch.manual_seed(1)
    target = torch.randn(out.shape)
    loss = mse(out, target)
    loss.backward()
    return model, loss.detach(), target


@pytest.mark.slow       # spawns 2 processes (each imports torch and memflow)
@pytest.mark.parametrize("launch", sorted(CASES))
def test_parameter_splits_match_one_process(launch, tmp_path):
    references = {name: _reference(name, options) for name, options, *_ in CASES[launch]}
    cases = [(name, options, units, _strategy(name, options, units, split, policies).to_dict(),
              references[name][2]) for name, options, units, split, policies in CASES[launch]]
    ranks = run_ranks(_worker, 2, tmp_path, cases)
    for k, (name, options, units, doc, _) in enumerate(cases):
        model, loss, _ = references[name]
        for rank in ranks:
            rank_loss, rank_grads, widths = rank[k]
            if "seq_len" in options:
                assert widths == [options["seq_len"] // (2 if "sequence_parallel" in doc
                                                         else 1)]
            torch.testing.assert_close(rank_loss, loss, rtol=1e-5, atol=1e-6)
            grads = gathered([rank_grads], model)
            assert grads.keys() == {n for n, _ in model.named_parameters()}
            for n, p in model.named_parameters():
                torch.testing.assert_close(grads[n], p.grad, rtol=1e-4, atol=1e-6,
                                           msg=f"{name} {units} {n}")


def _replica_worker(rank, options, docs, target):
    """Per strategy document: a replica's share of the batch on its 2-rank group, model
    states as the strategy says over the 2 replicas (``shard_model`` on the dp mesh: gradients
    averaged, FSDP2, bf16), returned whole, with the dtypes after an optimizer step."""
    from torch.distributed.device_mesh import init_device_mesh
    from memflow.export.fsdp import shard_model
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    replica, out = rank // 2, []
    for doc in docs:
        s = Strategy.from_dict(doc)
        model, (x,) = _model("chain", options, batch=8)
        exported = parallelize(model, s, mesh["tp"])
        sharding = shard_model(exported, levels=s.shard, mesh=mesh["dp"])
        rows = slice(replica * 4, (replica + 1) * 4)
        loss = mse(sharding.module(sharding.inputs(x[rows])), target[rows])
        loss.backward()
        sharding.after_backward()
        grads = {n: g.float() for n, g in full_gradients(sharding.module).items()}
        optimizer = sharding.optimizer(torch.optim.Adam, lr=1e-3)
        optimizer.step()
        dtypes = {str(p.dtype) for p in sharding.module.parameters()}
        out.append((loss.detach().float(), grads, dtypes, len(optimizer.masters)))
    return out


@pytest.mark.slow       # spawns 4 processes
def test_replicas_of_a_tensor_parallel_group_average_their_gradients(tmp_path):
    """2 replicas x 2 tensor-parallel ranks, in fp32 (exact), in bf16 (bf16 parameters
    stepped through fp32 master copies) and in bf16 with the split units' shards sharded by
    FSDP2 over the replicas (MixedPrecisionPolicy, as torchtitan composes them)."""
    options = {"n": 3, "width": 16, "kind": "residual"}
    graph = memflow.zoo.graph("chain", batch_size=8, units="blocks", **options)
    s = Strategy.tensor_parallel(graph, 4, tp=2, dp=2)
    assert tensor_ranks(s) == {"gpu0": 0, "gpu1": 1, "gpu2": 2, "gpu3": 3}
    split = [n for n, p in zip(graph.names, s.parameter) if p > 1]
    bf16 = s.with_model_states(precision="bf16")
    cases = [s, bf16, bf16.with_shard(dict.fromkeys(split, "parameters"))]
    model, (x,) = _model("chain", options, batch=8)
    out = model(x)
    torch.manual_seed(1)
    target = torch.randn(out.shape)
    loss = mse(out, target)
    loss.backward()
    half, _ = _model("chain", options, batch=8)      # the bf16 reference: one process in bf16
    mse(half.to(torch.bfloat16)(x.to(torch.bfloat16)), target).backward()
    ranks = run_ranks(_replica_worker, 4, tmp_path, options, [c.to_dict() for c in cases],
                      target)
    for k, case in enumerate(cases):
        wide = case.precision in (None, "fp32")
        reference = dict(model.named_parameters() if wide else half.named_parameters())
        torch.testing.assert_close(torch.stack([r[k][0] for r in ranks]).mean(), loss.detach(),
                                   rtol=1e-5 if wide else 2e-2, atol=1e-6 if wide else 0.0)
        for _, grads, dtypes, masters in (r[k] for r in ranks):
            assert dtypes == ({"torch.float32"} if wide or case.shard.any() else
                              {"torch.bfloat16"}), k
            # every unit is split: FSDP2 holds them all in fp32, or each has an fp32 master
            assert masters == (0 if wide or case.shard.any() else len(list(model.parameters())))
            for n, p in reference.items():
                scale = 1e-6 if wide else 0.05 * float(p.grad.abs().max())
                torch.testing.assert_close(grads[f"module.{n}"], p.grad.float(),
                                           rtol=1e-4 if wide else 0.1, atol=scale,
                                           msg=lambda m, k=k, n=n: f"{k} {n}: {m}")


def test_the_plan_pairs_megatron_linears_and_gathers_the_rest():
    graph = _graph("gpt2", GPT2, "leaves")
    s = _split(graph, CASES["transformers"][0][3])
    model, _ = _model("gpt2", GPT2)
    assert tensor_plan(model, s, graph) == {
        "wte": "colwise", "wpe": "colwise", "h.0.attn.qkv": "colwise",
        "h.0.attn.proj": "colwise", "h.0.mlp.fc": "colwise-sharded",
        "h.0.mlp.proj": "rowwise", "h.1.mlp.fc": "colwise"}
    # without the graph, where each output flows is unknown: every split is gathered
    assert set(tensor_plan(model, s).values()) == {"colwise"}
    blocks = _graph("gpt2", GPT2, "blocks")
    plan = tensor_plan(model, Strategy.tensor_parallel(blocks, 2, tp=2), blocks)
    # inside a split block the MLP is a Megatron pair, and so is the attention (by heads)
    assert plan["h.1.mlp.fc"] == "colwise-sharded" and plan["h.1.mlp.proj"] == "rowwise"
    assert plan["h.1.attn.qkv"] == "colwise-qkv" and plan["h.1.attn.proj"] == "rowwise"
    assert "ln_f" not in plan
    # heads that do not divide among the ranks: the attention's linears stay gathered (a
    # split validation refuses, tensor_degree 3: Strategy.tensor_parallel leaves the blocks
    # whole, so the blocks are split here by hand)
    odd = dict(GPT2, hidden=18, n_head=3)
    three = _graph("gpt2", odd, "blocks")
    uneven = Strategy.tensor_parallel(three, 2, tp=2).with_config(
        ["h.0", "h.1"], parameter=2, devices=["gpu0", "gpu1"])
    plan = tensor_plan(_model("gpt2", odd)[0], uneven, three)
    assert plan["h.1.attn.qkv"] == plan["h.1.attn.proj"] == "colwise"
    # Llama's decoder layers: q, k, v by heads (2 key/value heads), the SwiGLU MLP by rows
    llama = _graph("tinyllama-1.1b", LLAMA, "blocks")
    decoder = _model("tinyllama-1.1b", LLAMA)[0]
    plan = tensor_plan(decoder, Strategy.tensor_parallel(llama, 2, tp=2), llama)
    assert {k.removeprefix("layers.1."): v for k, v in plan.items()
            if k.startswith("layers.1.")} == {
        "self_attn.q_proj": "colwise-sharded", "self_attn.k_proj": "colwise-sharded",
        "self_attn.v_proj": "colwise-sharded", "self_attn.o_proj": "rowwise",
        "mlp.gate_proj": "colwise-sharded", "mlp.up_proj": "colwise-sharded",
        "mlp.down_proj": "rowwise"}
    # 4 ranks do not divide 2 key/value heads: the attention stays gathered, the MLP pairs
    # (a split validation refuses, tensor_degree 2: made by hand)
    four = ["gpu0", "gpu1", "gpu2", "gpu3"]
    plan = tensor_plan(decoder, Strategy.tensor_parallel(llama, 4, tp=4).with_config(
        ["layers.0", "layers.1"], parameter=4, devices=four), llama)
    assert plan["layers.1.self_attn.k_proj"] == plan["layers.1.self_attn.o_proj"] == "colwise"
    assert plan["layers.1.mlp.down_proj"] == "rowwise"
    sp = tensor_plan(model, Strategy.tensor_parallel(blocks, 2, tp=2, sequence_parallel=True),
                     blocks)
    assert {k: v for k, v in sp.items() if k.startswith(("h.1.", "ln_f")) and "." not in k[4:]} \
        == {"h.1.ln_1": "sequence", "h.1.attn": "sequence-gathered", "h.1.ln_2": "sequence",
            "h.1.mlp": "sequence-gathered", "ln_f": "sequence"}
    with pytest.raises(ExportError, match="unit 'h.0.mlp.fc' .* is sequence parallel"):
        tensor_plan(model, s.with_config("h.0.mlp.fc", sequence_parallel=True), graph)
    assert tensor_ranks(s) == {"gpu0": 0, "gpu1": 1}


def test_what_tensor_parallelism_cannot_run_is_refused():
    graph = _graph("alexnet", ALEXNET, "leaves")
    model, _ = _model("alexnet", ALEXNET)
    with pytest.raises(ExportError, match="unit 'features.0': features.0 is a Conv2d"):
        tensor_plan(model, _split(graph, ["features.0"]), graph)
    two = _split(graph, ["classifier.1"]).with_config(
        "classifier.4", parameter=2, devices=("gpu2", "gpu3"))
    with pytest.raises(ExportError, match="unit 'classifier.4' is split over .* but unit "
                                          "'classifier.1' over"):
        tensor_ranks(two)
    saved = _split(graph, ["classifier.1"]).with_policy(offload=["classifier.1"])
    with pytest.raises(ExportError, match="unit 'classifier.1' is split over parameters and "
                                          "'offload'"):
        parallelize(model, saved, mesh=None, graph=graph)
    blocks = _graph("gpt2", GPT2, "blocks")
    with pytest.raises(ExportError, match="unit 'h.0' is split over parameters and recomputed, "
                                          "but it is a container"):
        parallelize(_model("gpt2", GPT2)[0], Strategy.tensor_parallel(blocks, 2, tp=2)
                    .with_policy(recompute=["h.0"]), mesh=None, graph=blocks)
    off = _split(graph, ["classifier.1"]).with_config("classifier.6", devices=("gpu5",))
    with pytest.raises(ExportError, match="unit 'classifier.6' runs replica 0 on 'gpu5', outside"):
        tensor_ranks(off)


def test_a_split_block_runs_its_ranks_in_one_process():
    """The one-process form of a Megatron block split (memflow.export.megatron): each declared
    module's ranks as copies on the unit's devices, outputs summed; same loss and gradients."""
    from memflow.export import apply
    graph = _graph("tinyllama-1.1b", LLAMA, "blocks")
    s = _split(graph, ["layers.0", "layers.1"]).with_policy(recompute=["layers.0"])
    model, (x,) = _model("tinyllama-1.1b", LLAMA)
    exported = apply(model, s, graph, devices={"gpu0": "cpu", "gpu1": "cpu"})
    reference, _ = _model("tinyllama-1.1b", LLAMA)
    torch.manual_seed(1)
    target = torch.randn(reference(x).shape)
    loss = mse(reference(x), target)
    loss.backward()
    split = mse(exported(x), target)
    split.backward()
    torch.testing.assert_close(split, loss, rtol=1e-5, atol=1e-6)
    layer = exported.module.layers[1]
    attn, mlp = layer.self_attn.parts, layer.mlp.parts
    whole = reference.layers[1]
    for got, want in [
            (torch.cat([a.k_proj.weight.grad for a in attn]), whole.self_attn.k_proj.weight.grad),
            (torch.cat([a.o_proj.weight.grad for a in attn], 1), whole.self_attn.o_proj.weight.grad),
            (torch.cat([m.up_proj.weight.grad for m in mlp]), whole.mlp.up_proj.weight.grad),
            (layer.input_layernorm.weight.grad, whole.input_layernorm.weight.grad)]:
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


@pytest.mark.slow       # one torchrun launch of 2 processes
def test_split_decoder_layers_hold_what_is_predicted(tmp_path):
    """Llama's decoder layers, embedding, norm and head split over 2 ranks (grouped-query
    attention by heads, SwiGLU by ffn rows): each rank holds the held-for-backward bytes and
    model states the simulator predicts, within 1% (the RMSNorm weights, replicated on both
    ranks, charged whole there: memflow.graph.slicing.split_parameters)."""
    from memflow.export.rank_validation import METRICS, validate_ranks
    options = {**TINY_ARCH, "seq_len": 16}
    graph = memflow.zoo.graph("tinyllama-1.1b", batch_size=4, units="blocks", **options)
    s = Strategy.tensor_parallel(graph, 2, tp=2)
    df = validate_ranks(s, "tinyllama-1.1b", model_options=options, batch_size=4, graph=graph,
                        folder=tmp_path)
    assert list(df.index) == [0, 1] and set(df["path"]) == {"tensor"}
    for metric in METRICS:
        assert (df[f"{metric}_error"].abs() <= 0.01).all(), df.T
