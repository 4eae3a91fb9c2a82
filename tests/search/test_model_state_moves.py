"""Search moves over shard level, precision and optimizer placement (issue 12 item 6)."""
import numpy as np

import memflow
from memflow.search import MCMCSearch
from memflow.search.moves import (DEFAULT_WEIGHTS, EXPORTED_MODEL_STATE_MOVES, MODEL_STATE_MOVES,
                                  MODEL_STATE_WEIGHTS, MOVES, optimizer_place, shard)
from memflow.search.space import SearchSpace, precision_choices
from memflow.search.synthetic import chain_graph


def test_on_by_default_exactly_where_export_runs_their_choices():
    """Search space = export space: export writes shard levels (FSDP2, ZeRO-1), bf16 and
    pure-bf16 precision and optimizer offload (memflow.export.model_states), so all three
    model-state moves are on by default."""
    assert set(MODEL_STATE_MOVES) <= set(MOVES)
    assert set(MODEL_STATE_MOVES) & set(DEFAULT_WEIGHTS) == set(EXPORTED_MODEL_STATE_MOVES)
    assert EXPORTED_MODEL_STATE_MOVES == ("shard", "precision", "optimizer_place")
    assert all(DEFAULT_WEIGHTS[m] > 0 for m in MODEL_STATE_MOVES)


def test_runnable_space_offers_the_model_state_moves_export_writes():
    """From data parallelism every model-state move proposes what export runs; what export
    refuses (ZeRO-1 over fp32 master copies) the space projects back onto what it runs.
    (A100s: on V100s, which have no bf16 units, the precision move proposes fp32 only.)"""
    g = chain_graph(3, batch=8)
    sp = SearchSpace(g, memflow.Cluster.preset("4xA100-80GB"))
    s = memflow.Strategy.data_parallel(g, 4)
    rng = np.random.default_rng(0)
    for move in MODEL_STATE_MOVES:
        for _ in range(10):
            prop = MOVES[move](rng, s, sp)
            assert memflow.strategy.runnable.unrunnable(prop.strategy, g) is None, move
    assert "amp" not in {MOVES["precision"](rng, s, sp).strategy.precision for _ in range(20)}
    refused = s.with_shard("optimizer").with_model_states(precision="bf16")
    assert "ZeroRedundancyOptimizer" in memflow.strategy.runnable.unrunnable(refused, g)
    assert not sp.admits(refused) and sp.runs(sp.project(refused))


def test_precision_moves_propose_bf16_only_where_a_device_has_bf16_units():
    """On V100s bf16 would hold what amp holds at the FP32 rate: not proposed there, while a
    mixed cluster (V100s and A100s) still gets it, simulated at its slowest device's rate."""
    g = chain_graph(3, batch=8)
    s = memflow.Strategy.data_parallel(g, 4).with_model_states(precision="fp32")
    rng = np.random.default_rng(0)
    v100 = memflow.Cluster.preset("4xV100-16GB")
    mixed = v100.replace(bf16=True, devices=["gpu3"])
    proposed = {}
    for name, cluster in (("v100", v100), ("mixed", mixed)):
        sp = SearchSpace(g, cluster, runnable=False)
        proposed[name] = {MOVES["precision"](rng, s, sp).strategy.precision for _ in range(40)}
    assert proposed == {"v100": {"amp"}, "mixed": {"amp", "bf16", "pure-bf16"}}
    assert precision_choices(s, bf16=False) == ["amp"]
    assert precision_choices(s.with_model_states(precision="bf16"), bf16=False) == ["fp32", "amp"]


def test_moves_respect_pins():
    g = chain_graph(3, batch=8)
    sp = SearchSpace(g, memflow.Cluster.preset("4xV100-16GB"), runnable=False)
    sp.pinned[[0, 1]] = True
    s = memflow.Strategy.data_parallel(g, 4)
    rng = np.random.default_rng(0)
    for _ in range(20):
        assert shard(rng, s, sp).unit == "l2"
        assert optimizer_place(rng, s, sp).unit == "l2"


def test_search_shards_what_does_not_fit():
    g = chain_graph(6, batch=8, width=2048)
    four = memflow.Cluster.preset("4xV100-16GB")
    sim = memflow.sim.Simulator(g, four, optimizer="adam")
    dp = memflow.Strategy.data_parallel(g, four)
    z3 = dp.with_shard("parameters")
    limit = (sim.evaluate(dp).peak.max() + sim.evaluate(z3).peak.max()) / 2
    search = MCMCSearch(g, four, memory_limit=limit, optimizer="adam", seed=1,
                        moves={"shard": 1.0}, runnable=False)
    search.run(iterations=60)
    best = search.best
    assert not sim.evaluate(dp).peak.max() <= limit
    assert sim.evaluate(best).peak.max() <= limit
    assert set(best.shard_levels) - {"none"}
    assert {**DEFAULT_WEIGHTS, **MODEL_STATE_WEIGHTS}["shard"] > 0
