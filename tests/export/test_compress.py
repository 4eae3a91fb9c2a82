"""``compress``: what a unit saves is packed by memflow's error-bounded quantizer, element by
element within the bound, and the gradients move only by the bound's effect."""
import pytest
import torch
from torch import nn

import memflow
from memflow.export import apply, validate
from memflow.strategy import Strategy

from models import grads, mismatches


def _model():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                          nn.Linear(64, 4))
    return model, torch.randn(64, 32)


@pytest.mark.parametrize("bound", [1e-4, 1e-2])
def test_saved_tensors_within_the_bound_and_gradients_close(bound):
    model, x = _model()
    graph = memflow.from_torch(model, x)
    # A tanh output is saved by the tanh and by the next Linear: compressed if both compress.
    s = Strategy.single_device(graph).with_policy({u: ("compress", bound) for u in "1234"})
    exported = apply(model, s, graph)
    seen = []
    exported.module[1].register_forward_hook(lambda m, args, out: seen.append(out))
    exported(x)
    out = seen[0]                                # tanh saves its output, compressed
    restored = out.grad_fn._saved_result
    assert not torch.equal(restored, out)
    assert (restored - out).abs().max() <= bound
    reference, got = grads(model, x), grads(exported, x)
    assert mismatches(reference, got) != []
    # tanh' = 1 - y²: a saved y off by at most the bound moves each gradient by O(bound).
    assert mismatches(reference, got, atol=20 * bound * max(g.abs().max() for g in
                                                            reference.values())) == []


def test_compressed_bytes_are_held_at_their_packed_size():
    model, x = _model()
    graph = memflow.from_torch(model, x)
    keep = Strategy.single_device(graph)
    full = validate(model, x, keep, graph).loc["saved_bytes", "measured"]
    # A storage another unit keeps stays on the device at full size, as in the memory model.
    half = validate(model, x, keep.with_policy({"1": "compress:1e-2"}), graph)
    assert half.loc["saved_bytes", "measured"] == half.loc["saved_bytes", "predicted"] == full
    table = validate(model, x, keep.with_policy({u: "compress:1e-2" for u in "1234"}), graph)
    tanh_outputs = graph.units.loc[["1", "3"], "saved_bytes"].sum()
    assert table.loc["saved_bytes", "measured"] < full - 0.6 * tanh_outputs
    assert table.loc["saved_bytes", "predicted"] < full


def test_the_step_inputs_are_held_whole():
    # the first Linear saves the model's input, which the caller holds through the step: a
    # pack of it would only add bytes, so export makes none and the memory model charges none
    from memflow.export.saved import SavedStore
    model, x = _model()
    graph = memflow.from_torch(model, x)
    keep = Strategy.single_device(graph)
    first = validate(model, x, keep.with_policy({"0": "compress:1e-2"}), graph)
    kept = validate(model, x, keep, graph)
    for table in (first, kept):
        assert table.loc["saved_bytes", "measured"] == table.loc["saved_bytes", "predicted"]
    assert first.loc["saved_bytes", "predicted"] == kept.loc["saved_bytes", "predicted"]
    leaf = torch.randn(64, 64, requires_grad=True)
    store = SavedStore(state=set())
    for inputs, records in (([leaf], 0), ([], 1)):      # sin saves its input
        store.reset(inputs)
        with store.compress(1e-2):
            leaf.sin()
        assert len(store.records) == records


def test_a_pack_goes_once_backward_has_used_it():
    # no pack outlives the backward that read it, with no garbage collection (the store's
    # strong list of packs made a cycle that kept every one until a collection)
    import gc
    from memflow.export.saved import _Saved
    model, x = _model()
    graph = memflow.from_torch(model, x)
    exported = apply(model, Strategy.single_device(graph).with_policy(
        {u: "compress:1e-2" for u in "1234"}), graph)
    def packs() -> set[int]:
        return {id(o) for o in gc.get_objects() if isinstance(o, _Saved)}

    gc.collect()
    gc.disable()
    try:
        earlier = packs()           # other tests' models may hold some
        loss = exported(x).sum()
        made = packs() - earlier
        loss.backward()
        left = packs() & made
    finally:
        gc.enable()
    assert made and not left
