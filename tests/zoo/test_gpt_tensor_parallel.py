"""Tensor and sequence parallelism of the zoo's GPT layer (Korthikanti et al. 2022, 4.2).

With ``t``-way tensor parallelism a 16-bit GPT layer holds ``sbh(10 + 24/t + 5as/(ht))``
bytes per GPU: its input, LayerNorms and dropout masks (the residual stream between the
tensor-parallel regions) stay replicated. Sequence parallelism splits them over the sequence
too: ``sbh(34 + 5as/h)/t``. A layer's held bytes are the difference between a three- and a
two-layer model (each block saves the previous one's output, its input). The LayerNorms'
fp32 statistics (16sb, not in the paper's count) are within the tolerance.
"""
import pytest

from memflow.export.validation import predicted_held
from memflow.graph.capture import from_torch
from memflow.strategy import Strategy

zoo = pytest.importorskip("memflow.zoo")

SHAPES = [(128, 2, 256, 4, 2), (256, 1, 512, 8, 4), (64, 4, 384, 6, 2)]


def _graph(s, b, h, a, layers):
    model, ids = zoo.get("gpt2", batch_size=b, n_layer=layers, hidden=h, n_head=a, seq_len=s,
                         vocab=1000)
    return from_torch(model.half(), ids, backend="cuda", units="blocks")


def _layer_held(graphs, t, **tp):
    held = [predicted_held(g, Strategy.tensor_parallel(g, t, tp=t, **tp))["gpu1"]
            for g in graphs]
    return held[0] - held[1]


@pytest.mark.parametrize("s, b, h, a, t", SHAPES)
def test_tensor_parallel_layer_holds_korthikanti_bytes(s, b, h, a, t):
    graphs = [_graph(s, b, h, a, 3), _graph(s, b, h, a, 2)]
    sbh = s * b * h
    assert _layer_held(graphs, t) == pytest.approx(
        sbh * (10 + 24 / t + 5 * a * s / (h * t)), rel=0.02)
    assert _layer_held(graphs, t, sequence_parallel=True) == pytest.approx(
        sbh * (34 + 5 * a * s / h) / t, rel=0.02)


def test_sequence_parallelism_moves_the_same_bytes_in_the_same_time():
    """Each all-reduce becomes a reduce-scatter and an all-gather: the same bytes on a ring,
    so the step time does not move; the activations per GPU shrink."""
    import memflow
    g = _graph(64, 2, 256, 4, 2)
    node = memflow.Cluster.preset("4xV100-16GB")
    tp, sp = (memflow.simulate(g, Strategy.tensor_parallel(g, 4, tp=4, sequence_parallel=x),
                               node) for x in (False, True))
    assert sp.iteration_time == pytest.approx(tp.iteration_time, rel=1e-12)
    assert sp.timeline["bytes"].sum() == pytest.approx(tp.timeline["bytes"].sum(), rel=1e-12)
    acts = [r.breakdown().loc["gpu1", "activations"] for r in (tp, sp)]
    assert acts[1] < 0.8 * acts[0]


def _attention_core(names):
    """Megatron's selective recomputation: the attention core's units in every layer (the
    attention's glue around ``attn_dropout``; tests/zoo/test_gpt_selective.py)."""
    return [n for n in names if n.endswith((".attn", ".attn.attn_dropout")) or ".attn#" in n]


@pytest.mark.parametrize("s, b, h, a, ts", [(128, 2, 256, 4, (2, 4)), (256, 1, 512, 8, (2, 4)),
                                            (64, 4, 384, 6, (2,))])
def test_selective_with_sequence_parallelism_holds_34sbh_over_t(s, b, h, a, ts):
    """At leaf units a layer's parameter-free units split with its Linears (its ``block``,
    ``whole_blocks``), so
    recomputing the attention core under tensor and sequence parallelism holds ``34sbh/t``
    (Korthikanti et al. 2022, 5), ``sbh(10 + 24/t)`` without sequence parallelism."""
    graphs = []
    for layers in (2, 1):
        model, ids = zoo.get("gpt2", batch_size=b, n_layer=layers, hidden=h, n_head=a,
                             seq_len=s, vocab=1000)
        graphs.append(from_torch(model.half(), ids, backend="cuda", units="leaves"))
    assert graphs[0].units.loc["h.1.mlp.act", "block"] == "h.1"
    sbh = s * b * h
    for t in ts:
        held = {}
        for sp in (False, True):
            for policy in ("keep", "recompute"):
                per_graph = []
                for g in graphs:
                    st = Strategy.tensor_parallel(g, t, tp=t, sequence_parallel=sp,
                                                  whole_blocks=True)
                    assert st.parameter[g.names.index("h.0.mlp.act")] == t
                    core = {n: policy for n in _attention_core(g.names)}
                    per_graph.append(predicted_held(g, st.with_policy(core))["gpu1"])
                held[sp, policy] = per_graph[0] - per_graph[1]
        assert held[True, "keep"] == pytest.approx(sbh * (34 + 5 * a * s / h) / t, rel=0.02)
        assert held[True, "recompute"] == pytest.approx(34 * sbh / t, rel=0.02)
        assert held[False, "recompute"] == pytest.approx(sbh * (10 + 24 / t), rel=0.02)


def test_a_whole_block_communicates_what_its_block_unit_does():
    """At leaf units a block split whole all-reduces only what crosses its edge — its output
    in forward, its input's gradient once in backward — as the block unit does."""
    import memflow
    node = memflow.Cluster.preset("4xV100-16GB")
    moved = []
    for units in ("blocks", "leaves"):
        model, ids = zoo.get("gpt2", batch_size=2, n_layer=2, hidden=256, n_head=4, seq_len=64,
                             vocab=1000)
        g = from_torch(model.half(), ids, backend="cuda", units=units)
        st = Strategy.tensor_parallel(g, 4, tp=4, sequence_parallel=True, whole_blocks=True)
        tl = memflow.simulate(g, st, node).timeline
        moved.append(tl.groupby("kind")["bytes"].sum()[["forward", "backward"]].tolist())
    assert moved[1] == moved[0] and min(moved[0]) > 0
