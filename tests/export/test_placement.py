"""Placement: units on their devices with transfers between them, parameter splits sharded,
data-parallel replicas, GPipe micro-batches."""
import pytest
import torch
from torch import nn

import memflow
from memflow.errors import ExportError
from memflow.export import apply, replicas, validate
from memflow.export.sharding import Sharded
from memflow.strategy import Strategy

from models import captured, grads, mismatches


def test_model_parallel_places_units_and_moves_their_inputs():
    # Without a second real device, the second half runs on "meta": the forward crosses from
    # CPU to it only if export moved those units' weights and inserted the transfer.
    model, inputs, graph = captured("chain")
    s = Strategy.model_parallel(graph, 2)
    exported = apply(model, s, graph, devices={"gpu0": "cpu", "gpu1": "meta"})
    where = {n.removeprefix("module."): p.device.type for n, p in exported.named_parameters()}
    home = {u: d[0] for u, d in zip(s.units, s.devices)}
    for name, device in where.items():
        unit = name.rsplit(".", 1)[0]
        assert device == ("cpu" if home[unit] == "gpu0" else "meta"), name
    assert exported(*inputs).device.type == "meta"
    assert next(model.parameters()).device.type == "cpu"        # the original stays


def _shard_grads(exported: nn.Module, name: str) -> dict:
    """Gradients of ``exported`` with the shards of unit ``name`` concatenated back."""
    found = grads(exported, exported.inputs)
    for kind, axis in (("weight", exported.axis), ("bias", 0)):
        parts = [found.pop(k) for k in sorted(found) if k.startswith(f"{name}.shards.")
                 and k.endswith(kind)]
        if parts:
            found[f"{name}.{kind}"] = torch.cat(parts, axis)
    return found


@pytest.mark.parametrize("model, x, unit, axis", [
    (nn.Sequential(nn.Linear(8, 12), nn.Tanh(), nn.Linear(12, 5)), torch.randn(4, 8), "0", 0),
    (nn.Sequential(nn.Conv2d(3, 6, 3), nn.ReLU(), nn.Conv2d(6, 4, 3)), torch.randn(2, 3, 9, 9),
     "2", 0),
    (nn.Sequential(nn.Embedding(20, 9), nn.Linear(9, 3)), torch.randint(0, 20, (4, 5)), "0", 1),
])
def test_parameter_split_shards_outputs_over_devices(model, x, unit, axis):
    graph = memflow.from_torch(model, x)
    s = Strategy.single_device(graph).with_config(unit, parameter=3,
                                                  devices=["gpu0", "gpu1", "gpu2"])
    exported = apply(model, s.with_policy(recompute=[unit]), graph)
    sharded = getattr(exported.module, unit)
    assert isinstance(sharded, Sharded) and len(sharded.shards) == 3
    exported.inputs, exported.axis = x, axis
    assert mismatches(grads(model, x), _shard_grads(exported, unit), atol=1e-6, rtol=1e-5) == []


def test_tied_weights_are_not_sliced():
    model, inputs, graph = captured("gpt2")
    s = Strategy.single_device(graph).with_config("lm_head", parameter=2,
                                                  devices=["gpu0", "gpu1"])
    with pytest.raises(ExportError, match="unit 'lm_head' shares its weight"):
        apply(model, s, graph)


def test_data_parallel_replicas_take_their_sample_part():
    model, inputs, graph = captured("chain")
    s = Strategy.data_parallel(graph, 2).with_policy(recompute=graph.names[:8])
    assert replicas(s) == 2
    exported = apply(model, s, graph, replica=1, devices={"gpu0": "meta", "gpu1": "cpu"})
    assert {p.device.type for p in exported.parameters()} == {"cpu"}
    assert mismatches(grads(model, inputs), grads(exported, inputs)) == []
    with pytest.raises(ExportError, match="replica 2 does not exist"):
        apply(model, s, graph, replica=2)


def test_gpipe_micro_batches():
    model, inputs, graph = captured("chain")
    s = Strategy.single_device(graph).with_schedule(microbatches=2, schedule="gpipe")
    s = s.with_policy(recompute=graph.names[:4], offload=graph.names[4:8])
    exported = apply(model, s, graph)
    assert mismatches(grads(model, inputs), grads(exported, inputs), atol=1e-6) == []
    assert abs(validate(model, inputs, s, graph).loc["saved_bytes", "error"]) <= 0.01
