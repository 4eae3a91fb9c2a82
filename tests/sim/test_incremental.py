"""A long-lived simulator, which re-places a strategy from the pieces it cached for the ones
before it, gives exactly what a fresh simulator gives (issue 15: incremental placement)."""
from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from memflow.search.moves import MOVES
from memflow.search.space import SearchSpace
from memflow.sim import Simulator
from memflow.strategy import SHARD_LEVELS, Strategy

from .graphs import cluster, graphs, strategies_for

CLUSTER = cluster("2x4xV100-16GB")
DEVICES = list(CLUSTER.devices.index)


def _same(a, b) -> None:
    assert a.iteration_time == b.iteration_time
    for field in ("kind", "unit", "mb", "duration", "channel_set", "dep_ptr", "dep_idx"):
        assert np.array_equal(getattr(a.tasks, field), getattr(b.tasks, field)), field
    assert np.array_equal(a.start, b.start) and np.array_equal(a.end, b.end)
    assert np.array_equal(a.device.peak[a.device_class], b.device.peak[b.device_class])
    assert np.array_equal(a.host.peak, b.host.peak)
    for k in ("sets", "raw_sets"):
        for x, y in zip(getattr(a.placement, k), getattr(b.placement, k)):
            assert np.array_equal(x, y), k


@settings(max_examples=15, deadline=None)
@given(st.data(), st.integers(0, 2 ** 16), st.sampled_from(["sgd", "adam"]))
def test_random_moves_give_what_a_fresh_simulator_gives(data, seed, optimizer):
    g = data.draw(graphs(max_units=6))
    s = data.draw(strategies_for(g, DEVICES)).validate(g, CLUSTER)
    space = SearchSpace(g, CLUSTER, policies=("keep", "recompute", "offload"), runnable=False)
    rng = np.random.default_rng(seed)
    kept = Simulator(g, CLUSTER, optimizer=optimizer)
    kept.run(s)
    names = list(MOVES)
    for _ in range(6):
        prop = MOVES[names[int(rng.integers(len(names)))]](rng, s, space)
        if prop is None:
            continue
        s = prop.strategy
        _same(kept.run(s), Simulator(g, CLUSTER, optimizer=optimizer).run(s))


def _same_result(a, b) -> None:
    """Two SimResults alike to the bit: the step, the peaks, the timeline and memory tables."""
    assert a.iteration_time == b.iteration_time
    for k in ("peak_memory", "host_peak"):
        pd.testing.assert_series_equal(getattr(a, k), getattr(b, k), check_exact=True)
    for k in ("timeline", "memory", "model_states"):
        pd.testing.assert_frame_equal(getattr(a, k), getattr(b, k), check_exact=True)


def _walk(s, space, rng, steps: int, back: float):
    """The strategies a search walks through from ``s``: each step a random move's proposal,
    or (with probability ``back``) a return to a strategy seen before (a rejected proposal, a
    restart at the best)."""
    seen, names = [s], list(MOVES)
    for _ in range(steps):
        if len(seen) > 1 and rng.random() < back:
            s = seen[int(rng.integers(len(seen)))]
        else:
            prop = MOVES[names[int(rng.integers(len(names)))]](rng, s, space)
            if prop is None:
                continue
            s = prop.strategy
            seen.append(s)
        yield s


@settings(max_examples=10, deadline=None)
@given(st.data(), st.integers(0, 2 ** 16), st.sampled_from(["sgd", "adam"]))
def test_a_chain_of_moves_and_returns_gives_fresh_results(data, seed, optimizer):
    """As a search walks: every move's proposal, and now and then a return to a strategy seen
    before (a rejected proposal, a restart at the best), on one simulator whose caches and
    delta-planned block tables carry over, gives the SimResult of a fresh simulator."""
    g = data.draw(graphs(max_units=6))
    s = data.draw(strategies_for(g, DEVICES)).validate(g, CLUSTER)
    space = SearchSpace(g, CLUSTER, policies=("keep", "recompute", "offload"), runnable=False)
    rng = np.random.default_rng(seed)
    kept = Simulator(g, CLUSTER, optimizer=optimizer)
    for s in _walk(s, space, rng, 8, 0.25):
        _same_result(kept.result(s), Simulator(g, CLUSTER, optimizer=optimizer).result(s))


def test_model_state_moves_reuse_the_block_table_and_match_a_fresh_simulator():
    """Shard levels and optimizer places changed under one placement (the block table re-made
    from the last one's, derived by delta) give a fresh simulator's SimResult."""
    from memflow.strategy import Strategy

    from .graphs import chain
    g = chain(saved=(100, 200, 300, 400), internal=(10, 20, 30, 40), params=4096)
    s = Strategy.data_parallel(g, DEVICES[:4])
    kept = Simulator(g, CLUSTER, optimizer="adam")
    steps = [lambda s: s.with_shard({"u1": "gradients"}),
             lambda s: s.with_policy({"u2": "recompute"}),
             lambda s: s.with_shard(dict.fromkeys(g.names, "parameters")),
             lambda s: s.with_model_states(offload_optimizer=["u0", "u3"]),
             lambda s: s.with_policy({"u0": "offload"}).with_shard({"u0": "none"}),
             lambda s: s.with_model_states(offload_optimizer=False)]
    for step in steps:
        s = step(s)
        _same_result(kept.result(s), Simulator(g, CLUSTER, optimizer="adam").result(s))
    assert len(kept._states_of) == 1      # one placement, its tables re-made by states


@functools.lru_cache(maxsize=None)
def _zoo(name: str):
    import memflow
    if name == "gpt2":
        return memflow.zoo.graph("gpt2", batch_size=8, seq_len=32, n_layer=2)
    return memflow.zoo.graph("resnet50", batch_size=8, image_size=32)


@settings(max_examples=4, deadline=None, derandomize=True)
@given(st.sampled_from(["gpt2", "resnet50"]), st.integers(0, 2 ** 16))
def test_search_moves_on_zoo_graphs_give_what_a_fresh_simulator_gives(name, seed):
    """A search's walk on a captured model (every move, the runnable space, returns to
    strategies seen before): the simulator whose placement caches carry over gives, to the
    bit, what a fresh simulator gives, tasks, timeline, peaks and every block."""
    g = _zoo(name)
    s = Strategy.data_parallel(g, DEVICES)
    space = SearchSpace(g, CLUSTER)
    rng = np.random.default_rng(seed)
    kept = Simulator(g, CLUSTER, optimizer="adam")
    for s in _walk(s, space, rng, 12, 0.2):
        a, b = kept.run(s), Simulator(g, CLUSTER, optimizer="adam").run(s)
        _same(a, b)
        for k in ("layout", "bytes", "alloc", "free", "category", "per_mb", "on_host"):
            assert np.array_equal(getattr(a.blocks, k), getattr(b.blocks, k)), k


def _same_structure(a, b) -> None:
    """Two Structures alike to the bit, field by field (CSR pairs compared part by part)."""
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        for u, v in (zip(x, y) if isinstance(x, tuple) else [(x, y)]):
            assert np.array_equal(u, v), f.name


@settings(max_examples=12, deadline=None)
@given(st.data(), st.sampled_from(["sgd", "adam"]),
       st.lists(st.tuples(st.sampled_from(SHARD_LEVELS), st.booleans()), min_size=1,
                max_size=4))
def test_model_state_moves_remake_only_the_structure_they_decide(data, optimizer, states):
    """A move that changes only shard levels and optimizer places re-makes only the DDP
    buckets and the gathered and scattered bytes of the placement's structure
    (:func:`memflow.sim.structure.with_states`): every field equals a fresh structure's."""
    g = data.draw(graphs(max_units=6))
    s = data.draw(strategies_for(g, DEVICES)).validate(g, CLUSTER)
    kept = Simulator(g, CLUSTER, optimizer=optimizer)
    kept.run(s)
    for level, host in states:
        unit = data.draw(st.sampled_from(g.names))
        s = s.with_shard({unit: level}).with_model_states(offload_optimizer=[unit] if host
                                                          else False)
        fresh = Simulator(g, CLUSTER, optimizer=optimizer)
        _same_structure(kept.placement(s).structure, fresh.placement(s).structure)
        _same(kept.run(s), fresh.run(s))


@settings(max_examples=20, deadline=None)
@given(st.data(), st.integers(0, 2 ** 16))
def test_layouts_interned_along_moves_are_the_distinct_placements_by_first_use(data, seed):
    """The simulator keys its caches by a strategy's interned layouts: along a walk of moves
    (device tuples shared between units and strategies, or equal ones made apart), the
    layouts are the distinct ``(sample, parameter, attribute, devices)`` of the units in order
    of first use, and each unit's id points at its own."""
    g = data.draw(graphs(max_units=6))
    s = data.draw(strategies_for(g, DEVICES)).validate(g, CLUSTER)
    space = SearchSpace(g, CLUSTER, policies=("keep", "recompute"), runnable=False)
    for s in _walk(s, space, np.random.default_rng(seed), 8, 0.0):
        own = list(zip(s.sample.tolist(), s.parameter.tolist(), s.attribute.tolist(),
                       s.devices))
        assert [s.layouts[i] for i in s.layout_ids] == own
        assert s.layouts == list(dict.fromkeys(own))



@settings(max_examples=15, deadline=None)
@given(st.lists(st.lists(st.integers(0, 1), min_size=2, max_size=2), min_size=1, max_size=4),
       st.sampled_from(["sgd", "adam"]))
def test_units_moved_among_the_same_layouts_reuse_them_and_match_a_fresh_simulator(
        assignments, optimizer):
    """Units given other layouts of the same list (a copy move's usual proposal) reuse what the
    list fixes whichever units take it (:class:`memflow.sim.run.OfLayouts`) and the copy
    routes' costs kept per list and distinct routes, and give a fresh simulator's result to
    the bit."""
    from .graphs import chain
    g = chain(saved=(100, 200, 300, 400), internal=(10, 20, 30, 40), params=4096)
    groups = (DEVICES[:4], DEVICES[4:6])        # two layouts, their list in this order
    kept = Simulator(g, CLUSTER, optimizer=optimizer)
    for rest in [[1, 0]] + assignments:
        s = Strategy.data_parallel(g, DEVICES[:4]).with_config(
            {u: {"sample": len(groups[k]), "devices": groups[k]}
             for u, k in zip(g.names, [0, 1] + rest)})
        _same_result(kept.result(s), Simulator(g, CLUSTER, optimizer=optimizer).result(s))
    assert len(kept._of_layouts_cache) == 1     # one list of layouts, whatever units take it
