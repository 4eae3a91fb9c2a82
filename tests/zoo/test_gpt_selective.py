"""Selective recomputation of the zoo's GPT layer (the ``selective`` policy).

Under ``selective`` a layer keeps its input (the checkpoint's) and the outputs of its
expensive ops — qkv (6sbh), ``q @ k^T`` (2as²b), ``att @ v`` (2sbh), ``proj`` (2sbh), ``fc``
(8sbh), the MLP's ``proj`` (2sbh) — and recomputes the rest: ``sbh(22 + 2as/h)`` bytes in 16-bit,
against ``sbh(34 + 5as/h)`` kept. That is what ``create_selective_checkpoint_contexts`` holds
when matmuls must be saved. Megatron's own selective recomputation (``34sbh``) recomputes the
attention core instead and keeps the cheap LayerNorm, GELU and dropout outputs; no op-name rule
reaches it (a saved ``native_dropout`` keeps its output as well as its mask), but with leaf units
it is ``recompute`` on the attention core's units (the attention's glue around
``attn_dropout``): the qkv output, their segment's input, takes the place of q, k and v.
"""
import numpy as np
import pytest

import memflow
from memflow.export.validation import predicted_held
from memflow.graph.capture import from_torch
from memflow.sim import Simulator
from memflow.strategy import Strategy

zoo = pytest.importorskip("memflow.zoo")


def _gpt(s, b, h, a):
    model, ids = zoo.get("gpt2", batch_size=b, n_layer=2, hidden=h, n_head=a, seq_len=s,
                         vocab=1000)
    return from_torch(model.half(), ids, backend="cuda", units="blocks")


@pytest.mark.parametrize("s, b, h, a", [(128, 2, 256, 4), (256, 1, 512, 8), (64, 4, 384, 6)])
def test_gpt_layer_selective_holds_its_expensive_outputs(s, b, h, a):
    g = _gpt(s, b, h, a)
    st = Strategy(g.names, devices=[("gpu0",)] * len(g))
    kept = predicted_held(g, st)["gpu0"]
    held = {p: g.units.loc["h.1", "saved_bytes"] - kept
            + predicted_held(g, st.with_policy({"h.1": p}))["gpu0"]
            for p in ("selective", "recompute")}
    sbh = s * b * h
    assert g.units.loc["h.1", "saved_bytes"] == pytest.approx(sbh * (34 + 5 * a * s / h),
                                                              rel=0.01)
    assert held["selective"] == pytest.approx(sbh * (22 + 2 * a * s / h), rel=0.02)
    assert held["recompute"] == pytest.approx(2 * sbh, rel=0.02)      # its input only


def test_selective_recomputes_only_the_cheap_ops():
    g = _gpt(128, 2, 256, 4)
    st = Strategy(g.names, devices=[("gpu0",)] * len(g))
    cluster = memflow.Cluster.preset("1xA100-40GB")
    layers = [g.names.index("h.0"), g.names.index("h.1")]
    times = {}
    for p in ("recompute", "selective"):
        r = memflow.simulate(g, st.with_policy({"h.0": p, "h.1": p}), cluster)
        tl = r.timeline
        times[p] = (tl["end"] - tl["start"])[tl["kind"] == "recompute"].sum()
    timing = Simulator(g, cluster).placement(st).timing
    u = g.units.loc[["h.0", "h.1"]]
    assert (u["expensive_fwd_flops"] > 0.9 * u["fwd_flops"]).all()
    assert times["recompute"] == pytest.approx(timing.forward[layers].sum())
    assert times["selective"] == pytest.approx(timing.cheap_forward[layers].sum())
    assert 0 < times["selective"] < times["recompute"]
    # consecutive selective units share a segment; a recomputed one starts another
    both = st.with_policy({"h.0": "selective", "h.1": "selective"}).segment[layers]
    mixed = st.with_policy({"h.0": "selective", "h.1": "recompute"}).segment[layers]
    assert np.unique(both).size == 1 and np.unique(mixed).size == 2


def _core(names, layer):
    return [n for n in names if n in (f"{layer}.attn", f"{layer}.attn.attn_dropout")
            or n.startswith(f"{layer}.attn#")]


@pytest.mark.parametrize("s, b, h, a", [(128, 2, 256, 4), (256, 1, 512, 8), (64, 4, 384, 6)])
def test_megatron_selective_is_recompute_of_the_attention_core(s, b, h, a):
    model, ids = zoo.get("gpt2", batch_size=b, n_layer=2, hidden=h, n_head=a, seq_len=s,
                         vocab=1000)
    g = from_torch(model.half(), ids, backend="cuda", units="leaves")
    core = _core(g.names, "h.1")
    assert len(core) == 3
    st = Strategy(g.names, devices=[("gpu0",)] * len(g))
    layer = [n for n in g.names if n.startswith("h.1")]
    held = (g.units.loc[layer, "saved_bytes"].sum() - predicted_held(g, st)["gpu0"]
            + predicted_held(g, st.with_policy({n: "recompute" for n in core}))["gpu0"])
    assert held == pytest.approx(34 * s * b * h, rel=0.02)
