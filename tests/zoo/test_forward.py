"""Every zoo model runs a training step: real tensors on CPU (shrunk), full size on meta."""
import pytest
import torch

from memflow import zoo
from memflow.zoo.inception import InceptionAux
from memflow.zoo.llama import TINY as TINY_LLAMA

B = 2
TINY_GPT = {"vocab": 97, "max_positions": 16, "hidden": 32, "n_layer": 2, "n_head": 4,
            "seq_len": 16}
TINY_BERT = {**TINY_GPT, "ffn": 48}

# name -> (options that shrink it, expected output shape at batch B)
TINY = {
    "alexnet": ({"image_size": 64, "num_classes": 10, "hidden": 32}, (B, 10)),
    "vgg16": ({"image_size": 32, "num_classes": 10, "hidden": 32}, (B, 10)),
    "vgg19": ({"image_size": 32, "num_classes": 10, "hidden": 32}, (B, 10)),
    "resnet50": ({"image_size": 32, "width": 4, "num_classes": 10}, (B, 10)),
    "resnet101": ({"image_size": 32, "width": 4, "num_classes": 10}, (B, 10)),
    "inception_v3": ({"image_size": 75, "aux_logits": False, "num_classes": 10}, (B, 10)),
    "googlenet": ({"image_size": 32, "num_classes": 10}, (B, 10)),
    "gpt2": (TINY_GPT, (B, 16, 97)),
    "gpt2-medium": (TINY_GPT, (B, 16, 97)),
    "gpt2-large": (TINY_GPT, (B, 16, 97)),
    "gpt2-xl": (TINY_GPT, (B, 16, 97)),
    "bert-base": (TINY_BERT, (B, 32)),
    "bert-large": (TINY_BERT, (B, 32)),
    **{name: (TINY_LLAMA, (B, 16, 97))
       for name in ("tinyllama-1.1b", "llama2-7b", "llama2-13b", "llama2-70b")},
    "gnmt": ({"vocab": 53, "hidden": 16, "src_len": 7, "tgt_len": 5}, (B, 5, 53)),
    "biglstm": ({"vocab": 53, "embed": 8, "hidden": 32, "proj": 8, "seq_len": 6}, (B, 6, 53)),
    "mlp": ({"width": 32}, (B, 10)),
    "chain": ({"n": 12, "width": 16, "width_seed": 3}, None),
}

# name -> output shape(s) at the default options and batch B (on meta: nothing is computed).
# Meta kernels run through Python reference code (~1 ms an op): GNMT's LSTMs step by step,
# so its sequences are shortened, and the larger GPT-2s keep their width but two layers.
FULL_OPTIONS = {"gnmt": {"src_len": 6, "tgt_len": 4}, "gpt2-medium": {"n_layer": 2},
                "gpt2-large": {"n_layer": 2}, "gpt2-xl": {"n_layer": 2},
                "tinyllama-1.1b": {"n_layer": 2}, "llama2-7b": {"n_layer": 2},
                "llama2-13b": {"n_layer": 2}, "llama2-70b": {"n_layer": 2}}
FULL = {
    "alexnet": (B, 1000), "vgg16": (B, 1000), "vgg19": (B, 1000), "resnet50": (B, 1000),
    "resnet101": (B, 1000), "inception_v3": ((B, 1000), (B, 1000)), "googlenet": (B, 1000),
    "gpt2": (B, 1024, 50257), "gpt2-medium": (B, 1024, 50257), "gpt2-large": (B, 1024, 50257),
    "gpt2-xl": (B, 1024, 50257), "bert-base": (B, 768), "bert-large": (B, 1024),
    "tinyllama-1.1b": (B, 2048, 32000), "llama2-7b": (B, 4096, 32000),
    "llama2-13b": (B, 4096, 32000), "llama2-70b": (B, 4096, 32000),
    "gnmt": (B, 4, 32320), "biglstm": (B, 20, 793470), "mlp": (B, 10), "chain": (B, 1024),
}


@pytest.fixture
def plain_cpu_kernels(monkeypatch):
    # oneDNN compiles a kernel for each new convolution shape: seconds for Inception's first
    # step, far more than the step itself at these sizes. The results do not depend on it.
    monkeypatch.setattr(torch.backends.mkldnn, "enabled", False)


def shapes(out):
    return tuple(shapes(o) for o in out) if isinstance(out, tuple) else tuple(out.shape)


def test_tables_cover_the_zoo():
    assert sorted(TINY) == sorted(FULL) == sorted(zoo.names())


@pytest.mark.parametrize("name", sorted(TINY))
def test_cpu_training_step(name, plain_cpu_kernels):
    cfg, expected = TINY[name]
    model, inputs = zoo.get(name, batch_size=B, device="cpu", **cfg)
    assert model.training
    assert all(x.device.type == "cpu" for x in inputs)
    out = model(*inputs)
    if expected is None:  # a chain of mlp layers ends at its last width
        expected = (B, model.layers[-1].fc.out_features)
    assert tuple(out.shape) == expected
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    out.float().square().mean().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing


@pytest.mark.parametrize("name", sorted(FULL))
def test_meta_forward_at_full_size(name):
    model, inputs = zoo.get(name, batch_size=B, **FULL_OPTIONS.get(name, {}))
    assert all(x.device.type == "meta" for x in inputs)
    assert shapes(model(*inputs)) == FULL[name]


def test_inception_v3_aux_head_on_cpu():
    # The full trunk at 299 pixels is too slow for CI; the head alone is what the tiny
    # training step above leaves out.
    torch.manual_seed(0)
    head = InceptionAux(768, 10)
    out = head(torch.randn(B, 768, 17, 17))
    assert out.shape == (B, 10)


@pytest.mark.parametrize("name,aux", [("inception_v3", {}), ("googlenet", {"aux_logits": True})])
def test_aux_outputs_only_in_training(name, aux):
    model, inputs = zoo.get(name, batch_size=B, **aux)
    assert isinstance(model(*inputs), tuple)
    assert shapes(model.eval()(*inputs)) == (B, 1000)


def test_googlenet_aux_logits_on_cpu(plain_cpu_kernels):
    model, inputs = zoo.get("googlenet", batch_size=B, device="cpu", aux_logits=True,
                            image_size=32, num_classes=10)
    assert shapes(model(*inputs)) == ((B, 10),) * 3


def test_residual_chain_keeps_its_width():
    model, (x,) = zoo.get("chain", batch_size=B, device="cpu", n=5, width=8, kind="residual",
                          widths=(4, 16, 2, 8, 32))
    assert model(x).shape == (B, 8)
    assert [layer.fc1.out_features for layer in model.layers] == [4, 16, 2, 8, 32]


def test_thousand_layer_residual_chain_builds_on_meta():
    # Chen et al.'s sqrt(n) experiment; running it on meta is capture's job (and slow here).
    model, (x,) = zoo.get("chain", n=1000, kind="residual", width=256)
    assert len(model.layers) == 1000 and x.shape == (64, 256)
    assert sum(p.numel() for p in model.parameters()) == 1000 * (2 * 256 * 256 + 256 + 256)


def test_gpt_attention_is_explicit():
    """The block is Megatron-like: named pieces, no fused attention, dropout 0.1."""
    model, _ = zoo.get("gpt2")
    assert isinstance(model.h, torch.nn.ModuleList) and len(model.h) == 12
    block = model.h[0]
    names = {n for n, _ in block.named_modules()}
    assert {"ln_1", "attn.qkv", "attn.attn_dropout", "attn.proj", "attn.resid_dropout", "ln_2",
            "mlp.fc", "mlp.act", "mlp.proj", "mlp.dropout"} <= names
    assert block.mlp.act.approximate == "tanh"
    assert {m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)} == {0.1}
    mask = block.attn.mask
    assert mask.dtype == torch.bool and mask is model.h[11].attn.mask
    assert "h.0.attn.mask" not in model.state_dict()


def test_dropout_option_reaches_every_dropout():
    model, _ = zoo.get("gpt2", dropout=0.0, n_layer=2)
    assert {m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)} == {0.0}


def test_resnet_names_follow_torchvision():
    model, _ = zoo.get("resnet50")
    children = [n for n, _ in model.named_children()]
    assert children == ["conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3",
                        "layer4", "avgpool", "fc"]
    assert [len(getattr(model, f"layer{i}")) for i in range(1, 5)] == [3, 4, 6, 3]
    block = [n for n, _ in model.layer1[0].named_children()]
    assert block == ["conv1", "bn1", "relu1", "conv2", "bn2", "relu2", "conv3", "bn3", "relu3",
                     "downsample"]


@pytest.mark.parametrize("name", ["alexnet", "vgg16", "vgg19"])
def test_vision_models_have_features_and_classifier(name):
    model, _ = zoo.get(name)
    assert [n for n, _ in model.named_children()] == ["features", "avgpool", "classifier"]
    assert isinstance(model.features, torch.nn.Sequential)
