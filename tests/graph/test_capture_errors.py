"""Bad input gives a CaptureError that names what is wrong; uncountable ops only warn."""
import warnings

import pytest
import torch
from torch import nn

from memflow.errors import CaptureError
from memflow.graph.capture import from_torch


@torch.library.custom_op("memflow_test::mystery", mutates_args=())
def mystery(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@mystery.register_fake
def _(x):
    return torch.empty_like(x)


mystery.register_autograd(lambda ctx, grad: grad)


@torch.library.custom_op("memflow_test::no_backward", mutates_args=())
def no_backward(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@no_backward.register_fake
def _(x):
    return torch.empty_like(x)


class Calls(nn.Module):
    def __init__(self, op):
        super().__init__()
        self.op = op
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.op(self.lin(x))


class Raises(nn.Module):
    def forward(self, x):
        raise ValueError("this block is broken")


def test_forward_that_raises_names_the_module_and_chains_the_error():
    model = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.ReLU(), Raises()))
    with pytest.raises(CaptureError, match=r"module '1\.1' \(Raises\) raised ValueError: "
                                           r"this block is broken") as info:
        from_torch(model, torch.randn(2, 4))
    assert isinstance(info.value.__cause__, ValueError)


def test_wrong_input_shape_says_what_the_module_expects():
    model = nn.Sequential(nn.Linear(784, 10))
    with pytest.raises(CaptureError) as info:
        from_torch(model, torch.randn(8, 100))
    message = str(info.value)
    assert "module '0' (Linear)" in message
    assert "in_features=784" in message and "args[0]: float32[8, 100]" in message


@pytest.mark.parametrize("inputs", ["pixels", 3, None, (), {"x": 1.0}])
def test_inputs_of_the_wrong_type_are_rejected(inputs):
    with pytest.raises(CaptureError, match="example_inputs"):
        from_torch(nn.Linear(2, 2), inputs)


def test_model_must_be_a_module():
    with pytest.raises(CaptureError, match="torch.nn.Module"):
        from_torch(lambda x: x, torch.randn(2))


def test_reading_a_tensor_value_is_explained():
    class Branchy(nn.Module):
        def forward(self, x):
            return x * 2 if x.sum() > 0 else x

    with pytest.raises(CaptureError, match="without values"):
        from_torch(Branchy(), torch.randn(2, 2))


def test_loss_fn_errors_are_capture_errors():
    model, x = nn.Linear(4, 2), torch.randn(3, 4)
    with pytest.raises(CaptureError, match="scalar"):
        from_torch(model, x, loss_fn=lambda out: out * 2)
    with pytest.raises(CaptureError, match="loss_fn raised IndexError"):
        from_torch(model, x, loss_fn=lambda out: out["logits"])


def test_an_op_without_flop_formula_counts_zero_and_warns_once():
    model = nn.Sequential(Calls(mystery), Calls(mystery))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        g = from_torch(model, torch.randn(2, 4))
    about = [w for w in seen if "memflow_test.mystery" in str(w.message)]
    assert len(about) == 1, [str(w.message) for w in about]
    assert "counts the FLOPs" in str(about[0].message)
    assert g.units.loc["0.lin", "fwd_flops"] > 0
    assert g.units.loc["0", "fwd_flops"] == 0 and g.units.loc["0", "fwd_ops"] == 1


def test_a_backward_fake_tensors_cannot_run_is_estimated_with_one_warning():
    model = Calls(no_backward)
    with pytest.warns(UserWarning, match="estimated as 2x forward") as seen:
        g = from_torch(model, torch.randn(2, 4))
    assert len([w for w in seen if "estimated as 2x" in str(w.message)]) == 1
    u = g.units
    assert (u["bwd_flops"] == 2 * u["fwd_flops"]).all()
    assert (u["bwd_ops"] == 2 * u["fwd_ops"]).all()
    assert u["saved_bytes"].sum() > 0                   # the forward is still measured
