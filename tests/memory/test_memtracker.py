"""memflow.estimate against PyTorch's own MemTracker on a real CPU training step (issue 2)."""
import pytest

import memflow
from memflow.sim import estimate
from memflow.memory.measure import memtracker_peak

MODELS = {"resnet50": dict(batch_size=2, image_size=32),
          "gpt2": dict(batch_size=1, seq_len=32, n_layer=2)}


@pytest.fixture(scope="module", params=sorted(MODELS))
def captured(request):
    name = request.param
    return name, memflow.zoo.graph(name, **MODELS[name])


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_estimate_within_5_percent_of_memtracker(captured, optimizer):
    name, g = captured
    model, inputs = memflow.zoo.get(name, device="cpu", **MODELS[name])
    measured = memtracker_peak(model, inputs, optimizer=optimizer)["Total"]
    est = estimate(g, "cpu", optimizer=optimizer).loc["total", "at_peak"]
    assert est == pytest.approx(measured, rel=0.05)
