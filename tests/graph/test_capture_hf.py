"""Capture runs the eager program on Hugging Face models (issue 18 item 1): what real CPU
autograd saves, within 0.5% (in practice exactly), with the attention masks people pass."""
import pytest
import torch
from torch import nn

from memflow.graph.capture import from_torch
from memflow.graph.measure import saved_bytes

from hf_models import HF_MODELS, _decoder

pytest.importorskip("transformers")


def close(captured: float, real: float) -> bool:
    return abs(captured - real) <= 0.005 * real


@pytest.mark.parametrize("name", sorted(HF_MODELS))
def test_saved_bytes_match_real_cpu_autograd(name):
    torch.manual_seed(0)
    model, inputs, loss_fn = HF_MODELS[name]()
    captured = from_torch(model, inputs, loss_fn=loss_fn).units["saved_bytes"].sum()
    real = saved_bytes(model, inputs, loss_fn=loss_fn)
    assert close(captured, real), (captured, real)


def test_a_padded_mask_takes_the_masked_branch_as_eager_does():
    # with padding an eager run builds the 4-D mask and repeats keys and values: so does capture
    torch.manual_seed(0)
    model, inputs, _ = _decoder("llama", padded=True)
    ones = dict(inputs, attention_mask=torch.ones_like(inputs["attention_mask"]))
    padded = from_torch(model, inputs).units["saved_bytes"].sum()
    assert padded == saved_bytes(model, inputs)
    assert padded > from_torch(model, ones).units["saved_bytes"].sum()


class Asks(nn.Module):
    """Records what the tracing predicates answer inside the forward."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.answers = {}

    def forward(self, x, mask):
        from transformers.utils.import_utils import is_tracing
        self.answers = {"jit": torch.jit.is_tracing(), "compiling": torch.compiler.is_compiling(),
                        "dynamo": torch._dynamo.is_compiling(), "transformers": is_tracing(mask)}
        return self.linear(x[mask.bool()])       # boolean indexing: the mask's value decides


def test_tracing_predicates_answer_as_in_an_eager_run():
    from transformers.utils import import_utils
    before = import_utils.is_fake_tensor
    model, x, mask = Asks(), torch.randn(3, 4), torch.tensor([1, 0, 1])
    graph = from_torch(model, (x, mask))
    assert model.answers == dict.fromkeys(model.answers, False)
    assert import_utils.is_fake_tensor is before
    assert graph.units["saved_bytes"].sum() == saved_bytes(model, (x, mask))
    # a mask on the meta device has no value: it looks traced, as before
    with pytest.raises(Exception, match="without values"):
        from_torch(model, (x, mask.to("meta")))
    assert model.answers["transformers"] is True
