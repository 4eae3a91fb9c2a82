"""Exact parameter counts on meta against the published / reference implementations."""
import pytest
import torch

from memflow import zoo

# Reference counts: torchvision's model builders (documented num_params of their weights),
# Hugging Face's GPT2LMHeadModel / BertModel / BertForMaskedLM, MLPerf's GNMT v2, and for
# the models without a published PyTorch count the sum of their layers (see each module).
COUNTS = {
    "alexnet": 61_100_840,
    "vgg16": 138_357_544,
    "vgg19": 143_667_240,
    "resnet50": 25_557_032,
    "resnet101": 44_549_160,
    "inception_v3": 27_161_264,       # with the auxiliary head (torchvision's default)
    "googlenet": 6_624_904,           # without auxiliary heads (torchvision's weights)
    "gpt2": 124_439_808,              # lm_head tied to wte, counted once
    "gpt2-medium": 354_823_168,
    "gpt2-large": 774_030_080,
    "gpt2-xl": 1_557_611_200,
    "bert-base": 109_482_240,         # BertModel with pooler
    "bert-large": 335_141_888,
    "tinyllama-1.1b": 1_100_048_384,  # untied head; Hugging Face LlamaForCausalLM's counts
    "llama2-7b": 6_738_415_616,
    "llama2-13b": 13_015_864_320,
    "llama2-70b": 68_976_648_192,
    "gnmt": 244_622_913,              # Wu et al.'s 8 + 8 layers in GNMT v2's modules
    "biglstm": 1_776_946_046,         # LSTM-8192-1024, vocabulary 793,470
    "mlp": 2_913_290,
    "chain": 10_496_000,
}

VARIANTS = [
    ("inception_v3", {"aux_logits": False}, 23_834_568),
    ("googlenet", {"aux_logits": True}, 13_004_888),
    ("vgg16", {"batch_norm": True}, 138_365_992),          # torchvision vgg16_bn
    ("bert-base", {"head": "mlm"}, 109_514_298),             # BertForMaskedLM
    ("gnmt", {"n_layer": 4}, 160_671_297),                   # MLPerf / NVIDIA GNMT v2
    ("resnet50", {"num_classes": 10}, 25_557_032 - 2049 * 990),
    ("chain", {"n": 3, "width": 4, "kind": "residual", "widths": (1, 2, 3)},
     sum(4 * h + h + h * 4 + 4 for h in (1, 2, 3))),
]


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_every_model_has_a_reference_count():
    assert sorted(COUNTS) == sorted(zoo.names())


@pytest.mark.parametrize("name", sorted(COUNTS))
def test_param_count(name):
    model, _ = zoo.get(name)
    assert n_params(model) == COUNTS[name]
    assert all(p.device.type == "meta" for p in model.parameters())


@pytest.mark.parametrize("name,cfg,count", VARIANTS)
def test_variant_param_count(name, cfg, count):
    model, _ = zoo.get(name, **cfg)
    assert n_params(model) == count


def test_info_counts_match():
    table = zoo.info()
    assert table["params"].to_dict() == COUNTS


@pytest.mark.parametrize("name,head,embedding", [("gpt2", "lm_head", "wte"),
                                                 ("bert-base", "decoder",
                                                  "embeddings.word_embeddings")])
def test_output_layer_is_tied_to_the_embedding(name, head, embedding):
    model, _ = zoo.get(name, **({"head": "mlm"} if name.startswith("bert") else {}))
    assert model.get_submodule(head).weight is model.get_submodule(embedding).weight
