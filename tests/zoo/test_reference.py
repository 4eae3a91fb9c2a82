"""The transformer zoo computes what Hugging Face's reference models compute.

Tiny configurations are built offline from configs, the reference weights are copied into the
zoo model (renamed; GPT-2's Conv1D weights transposed; BERT's query/key/value stacked into
one qkv), and the outputs compared in eval mode (dropout off).
"""
import pytest
import torch

from memflow import zoo

transformers = pytest.importorskip("transformers")

SIZES = {"vocab": 61, "max_positions": 16, "hidden": 24, "n_layer": 2, "n_head": 3, "seq_len": 10}


def _load(model, weights):
    missing, unexpected = model.load_state_dict(weights, strict=False)
    # A tied head shares its weight with the embedding it is loaded through.
    assert unexpected == [] and set(missing) <= {"lm_head.weight"}


def test_gpt2_matches_hugging_face():
    config = transformers.GPT2Config(
        vocab_size=SIZES["vocab"], n_positions=SIZES["max_positions"], n_embd=SIZES["hidden"],
        n_layer=SIZES["n_layer"], n_head=SIZES["n_head"], bos_token_id=0, eos_token_id=0,
        attn_implementation="eager")
    torch.manual_seed(0)
    ref = transformers.GPT2LMHeadModel(config).eval()
    model, (ids,) = zoo.get("gpt2", batch_size=2, device="cpu", **SIZES)
    src = {k.removeprefix("transformer."): v for k, v in ref.state_dict().items()}
    names = {"attn.c_attn": "attn.qkv", "attn.c_proj": "attn.proj", "mlp.c_fc": "mlp.fc",
             "mlp.c_proj": "mlp.proj"}
    weights = {}
    for key, value in src.items():
        for old, new in names.items():
            if f".{old}." in key:
                key = key.replace(old, new)
                # Hugging Face's Conv1D stores (in, out); Linear stores (out, in).
                value = value.t() if key.endswith("weight") else value
        weights[key] = value
    _load(model, {k: v for k, v in weights.items() if k != "lm_head.weight"})
    with torch.no_grad():
        expected = ref(ids).logits
        assert torch.allclose(model.eval()(ids), expected, atol=1e-5)


def test_bert_matches_hugging_face():
    config = transformers.BertConfig(
        vocab_size=SIZES["vocab"], max_position_embeddings=SIZES["max_positions"],
        hidden_size=SIZES["hidden"], num_hidden_layers=SIZES["n_layer"],
        num_attention_heads=SIZES["n_head"], intermediate_size=4 * SIZES["hidden"],
        attn_implementation="eager")
    torch.manual_seed(0)
    ref = transformers.BertModel(config).eval()
    model, (ids,) = zoo.get("bert-base", batch_size=2, device="cpu", **SIZES)
    src = ref.state_dict()
    weights = {k: v for k, v in src.items() if k.startswith("embeddings.")
               and not k.endswith("_ids")}
    weights["pooler.0.weight"], weights["pooler.0.bias"] = (src["pooler.dense.weight"],
                                                            src["pooler.dense.bias"])
    for i in range(SIZES["n_layer"]):
        old, new = f"encoder.layer.{i}.", f"layer.{i}."
        for kind in ("weight", "bias"):
            weights[new + "attn.qkv." + kind] = torch.cat(
                [src[f"{old}attention.self.{p}.{kind}"] for p in ("query", "key", "value")])
            for ours, theirs in (("attn.proj", "attention.output.dense"),
                                 ("ln_1", "attention.output.LayerNorm"),
                                 ("mlp.fc", "intermediate.dense"),
                                 ("mlp.proj", "output.dense"), ("ln_2", "output.LayerNorm")):
                weights[f"{new}{ours}.{kind}"] = src[f"{old}{theirs}.{kind}"]
    _load(model, weights)
    with torch.no_grad():
        expected = ref(ids).pooler_output
        assert torch.allclose(model.eval()(ids), expected, atol=1e-5)


def test_reference_counts_at_full_size():
    """Hugging Face's own counts, built on meta from the released configurations."""
    with torch.device("meta"):
        gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config())
        bert = transformers.BertModel(transformers.BertConfig())
    ours = zoo.info()["params"]
    assert ours["gpt2"] == sum(p.numel() for p in gpt2.parameters())
    assert ours["bert-base"] == sum(p.numel() for p in bert.parameters())
