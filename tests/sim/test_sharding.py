"""Sharded model states, precision modes and optimizer offload in the memory model and the
simulator (issue 12 items 2-4)."""
import numpy as np
import pytest

import memflow
from memflow.sim import Simulator
from memflow.strategy import Strategy


@pytest.fixture(scope="module")
def gpt2xl():
    return memflow.zoo.graph("gpt2-xl", batch_size=64, seq_len=128)


@pytest.mark.parametrize("n, preset", [(8, "8xA100-80GB"), (64, "8x8xH100-80GB")])
def test_model_states_match_zero_formulas(gpt2xl, n, preset):
    """bf16 + Adam, data parallel over N: ZeRO's 16Ψ, 4Ψ+12Ψ/N, 2Ψ+14Ψ/N, 16Ψ/N per device."""
    psi = gpt2xl.units["trainable_bytes"].sum() / 4
    cluster = memflow.Cluster.preset(preset)
    sim = Simulator(gpt2xl, cluster, optimizer="adam")
    formulas = {"none": 16, "optimizer": 4 + 12 / n, "gradients": 2 + 14 / n,
                "parameters": 16 / n}
    for level, bytes_per_param in formulas.items():
        s = Strategy.data_parallel(gpt2xl, cluster, shard=level, precision="bf16")
        ms = sim.result(s).model_states
        assert len(ms) == n and list(ms.columns) == ["weights", "gradients", "optimizer"]
        per_device = ms.sum(axis=1)
        assert per_device.max() == pytest.approx(bytes_per_param * psi, rel=0.01), level
        assert per_device.min() == per_device.max()


def _chain():
    return memflow.zoo.graph("chain", batch_size=8, n=4, width=256)


def test_precisions_and_8bit_adam_bytes_per_parameter():
    g = _chain()
    one = memflow.Cluster.preset("1xV100-16GB")
    psi = g.units["trainable_bytes"].sum() / 4
    s = Strategy.single_device(g)
    want = {("fp32", "adam"): 16, ("amp", "adam"): 16, ("bf16", "adam"): 16,
            ("pure-bf16", "adam"): 8, ("fp32", "adam8bit"): 10, ("bf16", "adam8bit"): 10,
            ("fp32", "sgd"): 8}
    for (precision, opt), per in want.items():
        ms = Simulator(g, one, optimizer=opt).result(
            s.with_model_states(precision=precision)).model_states
        buffers = g.units["buffer_bytes"].sum()
        assert float(ms.sum(axis=1).iloc[0]) - buffers == pytest.approx(per * psi), (precision, opt)


def test_default_precision_is_the_simulators():
    g = _chain()
    one = memflow.Cluster.preset("1xV100-16GB")
    s = Strategy.single_device(g)
    a = Simulator(g, one, precision="amp").evaluate(s)
    b = Simulator(g, one).evaluate(s.with_model_states(precision="amp"))
    assert a.iteration_time == b.iteration_time and (a.peak == b.peak).all()


def test_fsdp_gathers_and_reduce_scatters_and_holds_gathered_params_around_their_unit():
    g = _chain()
    four = memflow.Cluster.preset("4xV100-16GB")
    sim = Simulator(g, four, optimizer="adam")
    dp = Strategy.data_parallel(g, four)
    z2 = sim.result(dp.with_shard("gradients"))
    z3 = sim.result(dp.with_shard("parameters"))
    with_params = int((g.units["param_bytes"] > 0).sum())
    kinds = z3.timeline["kind"].value_counts()
    assert kinds["allgather"] == 2 * with_params and kinds["reducescatter"] == with_params
    assert "allreduce" not in kinds
    assert "allgather" not in sim.result(dp).timeline["kind"].values
    # the gathers cost time the overlap cannot all hide, never more than they take
    gathers = z3.timeline.query("kind == 'allgather'")
    extra = z3.iteration_time - z2.iteration_time
    assert 0 < extra <= (gathers["end"] - gathers["start"]).sum() + 1e-12
    # a forward waits for its gather, which overlaps the compute task before (prefetch)
    tl = z3.timeline
    fwd = tl.query("kind == 'forward'")
    gat = tl.query("kind == 'allgather'").groupby("unit").first()
    before = fwd["end"].shift()
    for i, row in fwd.iterrows():
        if row["unit"] in gat.index:
            assert gat.loc[row["unit"], "end"] <= row["start"] + 1e-15
            if before[i] == before[i]:
                assert gat.loc[row["unit"], "start"] < before[i]
    # gathered parameters are held only during their unit: never two units' at once
    table = sim.placement(dp.with_shard("parameters")).blocks
    st = table.states
    assert z3.memory["communication"].max() == pytest.approx(
        float(np.max(st.gathered + st.unsharded)))
    assert z3.peak_memory.max() < sim.result(dp).peak_memory.max()


def test_optimizer_offload_moves_states_to_the_host_and_costs_time():
    g = _chain()
    one = memflow.Cluster.preset("1xV100-16GB")
    sim = Simulator(g, one, optimizer="adam")
    s = Strategy.single_device(g).with_model_states(precision="bf16")
    on = sim.result(s)
    off = sim.result(s.with_model_states(offload_optimizer=True))
    psi = g.units["trainable_bytes"].sum() / 4
    assert off.model_states["optimizer"].iloc[0] == 0
    assert on.model_states["optimizer"].iloc[0] == pytest.approx(12 * psi)
    # the host holds the states (and a gradient copy for the host's step)
    assert off.host_peak.iloc[0] - on.host_peak.iloc[0] == pytest.approx(14 * psi)
    assert off.peak_memory.iloc[0] < on.peak_memory.iloc[0]
    opt = off.timeline.query("kind == 'optimizer'")
    opt_on = on.timeline.query("kind == 'optimizer'")
    assert (opt["end"] - opt["start"]).sum() > (opt_on["end"] - opt_on["start"]).sum()


def test_recomputed_sharded_units_gather_again_and_export_runs_them():
    g = _chain()
    four = memflow.Cluster.preset("4xV100-16GB")
    sim = Simulator(g, four, optimizer="adam")
    s = Strategy.data_parallel(g, four, shard="parameters").with_policy(
        recompute=list(g.names[:-1]))
    tl = sim.result(s).timeline
    with_params = int((g.units["param_bytes"] > 0).sum())
    recomputed = set(tl.query("kind == 'recompute'")["unit"]) & set(
        g.units.index[g.units["param_bytes"] > 0])
    assert (tl["kind"] == "allgather").sum() == 2 * with_params + len(recomputed) > 2 * with_params
    # export runs it (memflow.export.fsdp shards each replica in the script)
    from memflow.export.exported import apply
    from memflow.strategy.runnable import unrunnable
    model, _ = memflow.zoo.get("chain", batch_size=8, n=4, width=256)
    assert unrunnable(s, g) is None
    assert apply(model, s, g, devices={d: "meta" for d in s.device_names}).strategy is s


def test_backward_prefetch_gathers_the_next_unit_before_reduce_scattering_this_one():
    from memflow.search.synthetic import chain_graph
    g = chain_graph(4, batch=8, width=256)
    four = memflow.Cluster.preset("4xV100-16GB")
    tl = Simulator(g, four).result(Strategy.data_parallel(g, four, shard="parameters")).timeline
    back = tl[tl.index > tl.query("kind == 'forward'").index.max()]
    order = [(k, u) for k, u in zip(back["kind"], back["unit"])
             if k in ("allgather", "reducescatter")]
    # l3 is first in backward: gather l3 (before its backward), gather l2, scatter l3, ...
    assert order[:4] == [("allgather", "l3"), ("allgather", "l2"), ("reducescatter", "l3"),
                         ("allgather", "l1")]
    assert order[-1] == ("reducescatter", "l0")


def test_fsdp2_holds_the_whole_gathered_unit_beside_its_shard():
    """FSDP2 all-gathers into separate unsharded tensors: while in use a unit holds its
    shard and all its parameters; with one replica nothing is gathered."""
    g = _chain()
    four = memflow.Cluster.preset("4xV100-16GB")
    sim = Simulator(g, four, optimizer="adam")
    st = sim.placement(Strategy.data_parallel(g, four).with_shard("parameters")).blocks.states
    assert st.gathered.tolist() == pytest.approx(g.units["param_bytes"].tolist())
    assert st.weights.tolist() == pytest.approx(
        (g.units["param_bytes"] / 4 + g.units["buffer_bytes"]).tolist())
    one = Strategy.single_device(g).with_shard("parameters")
    assert not Simulator(g, four).placement(one).blocks.states.gathered.any()


@pytest.mark.parametrize("precision", ["bf16", "pure-bf16"])
def test_half_precision_strategies_hold_half_width_activations(precision):
    """A bf16 step on an fp32 capture computes its activations in 2 bytes: activations and
    temporaries halve (simulator and estimate), integer inputs do not."""
    g = _chain()
    one = memflow.Cluster.preset("1xV100-16GB")
    s = Strategy.single_device(g)
    full = Simulator(g, one).result(s).memory
    half = Simulator(g, one).result(s.with_model_states(precision=precision)).memory
    for cat in ("activations", "transient"):
        assert half[cat].max() == pytest.approx(full[cat].max() / 2), cat
    e32 = memflow.estimate(g, "cpu", strategy=s)
    e16 = memflow.estimate(g, "cpu", strategy=s.with_model_states(precision=precision))
    assert e16.loc["activations", "max"] == pytest.approx(e32.loc["activations", "max"] / 2)
    # amp runs the autocast program capture's amp pass recorded: at batch 8 autocast's half
    # copies of the 256² weights outweigh its halved activations (tests/graph/test_amp_pass.py
    # checks that program against real autocast steps)
    amp = Simulator(g, one).result(s.with_model_states(precision="amp")).memory
    assert amp["activations"].max() > full["activations"].max()
