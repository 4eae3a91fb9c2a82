"""What export cannot express fails with an ExportError naming the unit — never a silent
change — and the in-place writes recompute can replay exactly do replay exactly."""
import pytest
import torch
from torch import nn

import memflow
from memflow.errors import ExportError
from memflow.export import apply
from memflow.strategy import Strategy

from models import captured, grads, mismatches


class Glue(nn.Module):
    """``a``, then the model's own code (``<root>``), then ``b``; ``op`` is that code."""

    def __init__(self, op):
        super().__init__()
        self.a, self.b, self.op = nn.Linear(4, 4), nn.Linear(4, 4), op

    def forward(self, x):
        return self.b(self.op(self.a(x)))


def _recompute_glue(op):
    model, x = Glue(op), torch.randn(3, 4)
    graph = memflow.from_torch(model, x)
    assert graph.names == ["a", "<root>", "b"]
    return model, x, apply(model, Strategy.single_device(graph).with_policy(
        recompute=["<root>"]), graph)


def _relu_(y):
    return y.relu_()


def _add_then_tanh(y):
    y.add_(1.0)
    return torch.tanh(y)


def _scatter_row(y):
    y[0] = 0.0
    return torch.sigmoid(y)


@pytest.mark.parametrize("op", [_relu_, _add_then_tanh, _scatter_row])
def test_replayable_writes_to_segment_inputs_keep_gradients_exact(op):
    # relu_ twice is relu_ once; add_ and a row write save nothing, so replay starts from
    # the value they left in the held input.
    model, x, exported = _recompute_glue(op)
    assert mismatches(grads(model, x), grads(exported, x)) == []


def _sigmoid_(y):
    return y.sigmoid_()


def _read_then_write(y):
    z = y * 2
    y.add_(1.0)
    return torch.tanh(z + y)


@pytest.mark.parametrize("op, why", [(_sigmoid_, "saves it for backward"),
                                     (_read_then_write, "read earlier")])
def test_unreplayable_writes_name_the_unit(op, why):
    model, x, exported = _recompute_glue(op)
    with pytest.raises(ExportError, match=f"unit '<root>'.*{why}"):
        exported(x)


class _Double(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return 2 * x

    @staticmethod
    def backward(ctx, grad):
        return 2 * grad


def test_custom_autograd_function_cannot_be_recomputed():
    model, x, exported = _recompute_glue(lambda y: torch.tanh(_Double.apply(y)))
    with pytest.raises(ExportError, match="unit '<root>' runs a custom autograd Function"):
        exported(x)


class WritesLater(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.act, self.b = nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4)

    def forward(self, x):
        y = self.a(x)
        z = self.act(y + 1)      # the segment reads y ...
        y.add_(1.0)              # ... which is written afterwards
        return self.b(z * y)


def test_input_written_after_its_segment_is_refused():
    model, x = WritesLater(), torch.randn(3, 4)
    graph = memflow.from_torch(model, x)
    s = Strategy.single_device(graph).with_policy(recompute=["<root>", "act"])
    with pytest.raises(ExportError, match="written in place after the segment"):
        apply(model, s, graph)(x)


class Branch(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.extra = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x, flag: bool = True):
        x = self.a(x)
        return self.extra(x) if flag else x


def test_a_forward_that_skips_units_is_refused():
    model, x = Branch(), torch.randn(3, 4)
    graph = memflow.from_torch(model, x)
    exported = apply(model, Strategy.single_device(graph), graph)
    with pytest.raises(ExportError, match="unit 'extra' did not run"):
        exported(x, flag=False)


def _chain():
    model, inputs, graph = captured("chain")
    return model, graph, Strategy.single_device(graph)


@pytest.mark.parametrize("change, message", [
    (lambda s, u: s.with_config(u[3], attribute=2, devices=["gpu0", "gpu1"]),
     r"unit 'layers.0' is split 2 ways over its attribute"),
    (lambda s, u: s.with_config(u[0], sample=2, devices=["gpu0", "gpu1"]).with_schedule(
        microbatches=2, schedule="gpipe"),
     r"unit 'layers.0.relu' has sample degree 1 but unit 'layers.0.fc1' has 2, and the "
     r"strategy has 2 micro-batches"),
    (lambda s, u: s.with_config(u[1], parameter=2, devices=["gpu0", "gpu1"]),
     r"unit 'layers.0.relu' \(ReLU\) has a parameter split of 2"),
    (lambda s, u: s.with_config(u[-1], devices=["gpu1"], stage=1).with_schedule(
        microbatches=1, schedule="1f1b"),
     r"2 stages under 1F1B need at least 2 micro-batches"),
])
def test_strategies_pytorch_cannot_run_name_the_unit(change, message):
    model, graph, s = _chain()
    with pytest.raises(ExportError, match=message):
        apply(model, change(s, graph.names))


def test_glue_cannot_be_sharded():
    model, inputs, graph = captured("gpt2")
    s = Strategy.single_device(graph).with_config("h.0.attn", parameter=2,
                                                  devices=["gpu0", "gpu1"])
    with pytest.raises(ExportError, match="unit 'h.0.attn' is glue"):
        apply(model, s)


def test_units_of_another_model_or_graph():
    model, graph, s = _chain()
    other = Strategy(["layers.0.fc9"], devices=[("gpu0",)])
    with pytest.raises(ExportError, match="unit 'layers.0.fc9': the model has no module"):
        apply(model, other)
    with pytest.raises(ExportError, match="not the graph's"):
        apply(model, other, graph)


def test_the_loss_unit_must_be_kept():
    model, x = nn.Sequential(nn.Linear(4, 2)), torch.randn(3, 4)
    graph = memflow.from_torch(model, x, loss_fn=lambda out: out.pow(2).mean())
    assert graph.names[-1] == "<loss>"
    s = Strategy.single_device(graph)
    apply(model, s, graph)(x).sum().backward()
    with pytest.raises(ExportError, match="unit '<loss>' is the loss"):
        apply(model, s.with_policy({"<loss>": "offload"}), graph)
