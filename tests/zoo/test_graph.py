"""zoo.graph() and the capture-facing structure of the zoo (skipped until capture exists)."""
import pytest

from memflow import zoo

capture = pytest.importorskip("memflow.graph.capture")


def test_graph_of_a_chain_has_one_unit_per_block():
    g = zoo.graph("chain", batch_size=4, n=3, width=16, units="blocks")
    assert g.names == ["layers.0", "layers.1", "layers.2"]
    assert g.meta["model"] == "chain" and g.meta["batch_size"] == 4
    assert int(g.units["params"].sum()) == 3 * (16 * 16 + 16)


def test_graph_counts_the_tied_head_once():
    g = zoo.graph("gpt2", batch_size=1, n_layer=1, seq_len=8)
    model, _ = zoo.get("gpt2", n_layer=1)
    assert int(g.units["params"].sum()) == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("s,b,h,a", [(128, 2, 768, 12), (256, 1, 512, 16)])
def test_gpt_layer_saves_korthikanti_activations(s, b, h, a):
    """A 16-bit GPT layer under CUDA rules saves sbh(34 + 5as/h) bytes (Korthikanti et al.)."""
    model, inputs = zoo.get("gpt2", batch_size=b, n_layer=2, hidden=h, n_head=a, seq_len=s)
    g = capture.from_torch(model.half(), inputs, units="blocks", backend="cuda")
    expected = s * b * h * (34 + 5 * a * s / h)
    # LayerNorm's per-token mean and inverse deviation (fp32) are the only extra bytes.
    assert g.units.loc["h.1", "saved_bytes"] == pytest.approx(expected, rel=1e-3)
