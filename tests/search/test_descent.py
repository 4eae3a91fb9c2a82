"""Descent (memflow.search.descent) and the micro-batch move (issue 15, item 3): descent ends
on a strategy no single change of the search's moves improves, never worse than where it
started and never touching a pinned unit; the micro-batch move splits every replica's batch
evenly and, with descent, finds gradient accumulation where it beats recomputation."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import memflow
from memflow.search import MCMCSearch
from memflow.search import descent
from memflow.search.descent import descend, neighbours
from memflow.search.moves import DEFAULT_WEIGHTS, MICROBATCH_WEIGHTS, MOVES
from memflow.search.space import SearchSpace
from memflow.search.synthetic import chain_graph
from memflow.sim import Evaluator

from .helpers import FOUR

MOVE_SET = {**DEFAULT_WEIGHTS, **MICROBATCH_WEIGHTS}


def _accumulation_case():
    """A 6-unit chain on 4 GPUs whose keep-all does not fit a limit that both recomputing
    every unit and two micro-batches fit; accumulation is the faster (4.57 against 5.71 ms)."""
    g = chain_graph(6, batch=8192, width=512)
    dp = memflow.Strategy.data_parallel(g, FOUR)
    free = Evaluator(g, FOUR)
    recompute = dp.with_policy(recompute=list(g.names)).with_segments("each")
    two = dp.with_schedule(microbatches=2)
    return g, dp, recompute, two, 1.01 * max(free(recompute).peak, free(two).peak)


def test_accumulation_found_where_it_beats_recomputation():
    g, dp, recompute, two, limit = _accumulation_case()
    ev = Evaluator(g, FOUR, limit)
    assert not ev(dp).fits and ev(recompute).fits and ev(two).fits
    assert ev(two).time < ev(recompute).time
    search = MCMCSearch(g, FOUR, memory_limit=limit, init=recompute, seed=0, moves=MOVE_SET)
    search.run(iterations=300)
    descend(search)
    best = ev(search.best)
    assert best.fits and search.best.microbatches > 1
    assert best.time <= ev(two).time * (1 + 1e-12)
    # without the move the chain never leaves one micro-batch
    plain = MCMCSearch(g, FOUR, memory_limit=limit, init=recompute, seed=0).run(iterations=300)
    descend(plain)
    assert plain.best.microbatches == 1


def _states(s, units):
    """The pinnable state of ``units`` (segment ids renumber as other segments change)."""
    cols = ["policy", "sample", "parameter", "devices", "stage", "shard", "offload_optimizer"]
    return s.table[cols].iloc[sorted(units)].astype(str).values.tolist()


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2**16), pinned=st.sets(st.integers(0, 5), max_size=2),
       iterations=st.integers(0, 60))
def test_descent_ends_where_no_single_change_improves(seed, pinned, iterations):
    g, _, recompute, _, limit = _accumulation_case()
    search = MCMCSearch(g, FOUR, memory_limit=limit, init=recompute, seed=seed, moves=MOVE_SET)
    if pinned:
        search.pin([g.names[i] for i in sorted(pinned)], policy="recompute")
    search.run(iterations=iterations)
    start = search.best_score
    frozen = _states(search.best, pinned)
    descend(search)
    end, ev = search.best_score, Evaluator(g, FOUR, limit)
    assert end.feasible or not start.feasible
    assert (not end.feasible, end.cost) <= (not start.feasible, start.cost)
    assert _states(search.best, pinned) == frozen
    best = ev(search.best)
    for option in neighbours(search.best, search.space, list(MOVE_SET)):
        o = ev(option)
        assert not o.fits or o.time >= best.time * (1 - 1e-12), option


def test_descent_stops_when_the_time_is_spent():
    g, _, recompute, _, limit = _accumulation_case()
    search = MCMCSearch(g, FOUR, memory_limit=limit, init=recompute, seed=0, moves=MOVE_SET)
    assert descend(search, seconds=0) == 0
    assert search.best == search.space.project(recompute)


@settings(max_examples=20, deadline=None)
@given(batch=st.sampled_from([1, 6, 8, 64, 96]), devices=st.sampled_from([1, 2, 4]),
       seed=st.integers(0, 2**16))
def test_microbatch_move_splits_every_replica_batch_evenly(batch, devices, seed):
    g = chain_graph(3, batch=batch, width=16, seed=seed)
    space = SearchSpace(g, FOUR)
    rng = np.random.default_rng(seed)
    s = space.project(memflow.Strategy.data_parallel(
        g, [d for d in range(devices) if batch % (d + 1) == 0][-1] + 1))
    for _ in range(8):
        prop = MOVES["microbatches"](rng, s, space)
        if prop is None:        # one micro-batch per sample and nothing below it
            assert batch // int(s.sample.max()) == 1
            return
        new = prop.strategy
        assert prop.unit == "" and new.microbatches != s.microbatches
        assert all(batch % (int(d) * new.microbatches) == 0 for d in new.sample)
        assert space.runs(new)
        new.validate(g, FOUR)
        s = new


def test_descent_settles_a_global_change(monkeypatch):
    """From every unit recomputed, two micro-batches alone are 5.8% slower (each micro-batch
    still recomputes); settled — the recomputation dropped unit by unit — they win: descent
    alone, no chain, reaches accumulation where it may settle a change that much worse
    (``SETTLE_WITHIN``), and stops at a keep/recompute schedule where it may not."""
    g, _, recompute, two, limit = _accumulation_case()
    ev = Evaluator(g, FOUR, limit)
    worse = ev(recompute.with_schedule(microbatches=2)).time / ev(recompute).time - 1
    assert 0.05 < worse < 0.1
    ends = {}
    for within in (0.1, 0.0):
        monkeypatch.setattr(descent, "SETTLE_WITHIN", within)
        search = MCMCSearch(g, FOUR, memory_limit=limit, init=recompute, seed=0,
                            moves={"policy": 1.0, "microbatches": 1.0})
        descend(search)
        assert search.iteration == 0 and ev(search.best).fits
        ends[within] = search.best
    assert ends[0.1].microbatches == 2 and set(ends[0.1].policies) == {"keep"}
    assert ev(ends[0.1]).time <= ev(two).time * (1 + 1e-12)
    assert ends[0.0].microbatches == 1 and ev(ends[0.0]).time > ev(two).time
