"""names(), get(), info(): defaults, options, determinism and errors."""
import pytest
import torch

from memflow import zoo
from memflow.errors import MemflowError

EXPECTED = ["alexnet", "vgg16", "vgg19", "resnet50", "resnet101", "inception_v3", "googlenet",
            "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "bert-base", "bert-large",
            "tinyllama-1.1b", "llama2-7b", "llama2-13b", "llama2-70b", "gnmt", "biglstm", "mlp",
            "chain"]


def test_names():
    assert zoo.names() == EXPECTED


def test_info_has_one_described_row_per_model():
    table = zoo.info()
    assert list(table.index) == EXPECTED
    assert list(table.columns) == ["family", "params", "batch_size", "inputs", "outputs",
                                   "source"]
    assert table.notna().all().all()
    assert (table["params"] > 0).all() and (table["batch_size"] > 0).all()
    assert set(table["family"]) == {"vision", "resnet", "inception", "transformer", "rnn",
                                    "basic"}


def test_default_batch_and_inputs_on_meta():
    model, inputs = zoo.get("gpt2")
    assert inputs[0].shape == (zoo.info().loc["gpt2", "batch_size"], 1024)
    assert inputs[0].dtype == torch.int64 and inputs[0].device.type == "meta"
    assert model.training
    assert {p.dtype for p in model.parameters()} == {torch.float32}


def test_batch_size_from_info_is_accepted():
    batch = zoo.info().loc["mlp", "batch_size"]       # a numpy integer
    _, (x,) = zoo.get("mlp", batch_size=batch)
    assert x.shape[0] == batch


def test_seq2seq_inputs():
    _, (src, tgt) = zoo.get("gnmt", batch_size=3, src_len=11, tgt_len=7)
    assert src.shape == (3, 11) and tgt.shape == (3, 7)


def test_options_override_architecture_and_inputs():
    model, (ids,) = zoo.get("gpt2-xl", batch_size=2, n_layer=3, seq_len=64)
    assert len(model.h) == 3 and ids.shape == (2, 64)
    model, (x,) = zoo.get("resnet50", batch_size=1, image_size=96)
    assert x.shape == (1, 3, 96, 96)


def _state(name, seed=0, **cfg):
    model, inputs = zoo.get(name, batch_size=2, device="cpu", seed=seed, **cfg)
    return model.state_dict(), inputs


@pytest.mark.parametrize("name,cfg", [
    ("resnet50", {"width": 4, "image_size": 32}),
    ("gpt2", {"n_layer": 1, "hidden": 16, "n_head": 2, "vocab": 50, "seq_len": 8}),
    ("gnmt", {"vocab": 30, "hidden": 8, "n_layer": 3, "src_len": 4, "tgt_len": 4}),
])
def test_cpu_init_is_deterministic(name, cfg):
    state_a, inputs_a = _state(name, **cfg)
    state_b, inputs_b = _state(name, **cfg)
    assert state_a.keys() == state_b.keys()
    assert all(torch.equal(state_a[k], state_b[k]) for k in state_a)
    assert all(torch.equal(a, b) for a, b in zip(inputs_a, inputs_b))
    state_c, inputs_c = _state(name, seed=1, **cfg)
    assert not all(torch.equal(state_a[k], state_c[k]) for k in state_a)
    assert not all(torch.equal(a, c) for a, c in zip(inputs_a, inputs_c))


def test_get_leaves_the_global_random_state_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    zoo.get("mlp", device="cpu", seed=7)
    assert torch.equal(torch.rand(3), expected)


def test_chain_widths_from_a_seed_are_varied_and_reproducible():
    def widths(seed):
        model, _ = zoo.get("chain", n=12, width_seed=seed)
        return [layer.fc.out_features for layer in model.layers]
    assert widths(5) == widths(5) != widths(6)
    assert len(set(widths(5))) > 6
    assert all(w % 8 == 0 and 256 <= w <= 4096 for w in widths(5))


def test_chain_units_are_blocks_in_a_module_list():
    model, _ = zoo.get("chain", n=14, kind="residual")
    assert isinstance(model.layers, torch.nn.ModuleList) and len(model.layers) == 14


@pytest.mark.parametrize("call,match", [
    (lambda: zoo.get("resnet"), r"unknown zoo model 'resnet'; valid: alexnet, .*resnet50"),
    (lambda: zoo.spec_of(None), "unknown zoo model None"),
    (lambda: zoo.get("gpt2", n_layers=2), r"'gpt2' has no option 'n_layers'; valid .*n_layer"),
    (lambda: zoo.get("gpt2", batch_size=0), "batch_size=0 must be a positive integer"),
    (lambda: zoo.get("gpt2", batch_size=2.0), "batch_size=2.0 must be a positive integer"),
    (lambda: zoo.get("mlp", device="gpu7"), "device='gpu7' is not a torch device"),
    (lambda: zoo.get("gpt2", seq_len=2048), "seq_len=2048 .* max_positions=1024"),
    (lambda: zoo.get("gpt2", n_head=7), "hidden=768 is not divisible by n_head=7"),
    (lambda: zoo.get("bert-base", head="nsp"), "head='nsp' is unknown; valid: pooler, mlm"),
    (lambda: zoo.get("chain", kind="conv"), "kind='conv' is unknown; valid: mlp, residual"),
    (lambda: zoo.get("chain", n=3, widths=(1, 2)), r"widths=\[1, 2\] must be 3 positive"),
    (lambda: zoo.get("chain", n=0), "chain needs n >= 1"),
    (lambda: zoo.get("gnmt", n_layer=1), "n_layer=1 is too small; valid: n_layer >= 2"),
])
def test_errors_name_the_field_and_the_valid_values(call, match):
    with pytest.raises(MemflowError, match=match):
        call()
