"""The pipeline planner on hand-checked chains and against enumeration in simulation."""
import itertools

import numpy as np
import pytest

import memflow
from memflow.errors import PlanError
from memflow.planners import Infeasible, pipeline, pipeline_table
from memflow.strategy import Strategy

from .graphs import GIB, chain

C4 = "4xV100-16GB"


def test_uniform_chain_splits_evenly():
    s = pipeline(chain(8), C4, microbatches=4)
    assert s.stage.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [d[0] for d in s.devices] == ["gpu0"] * 2 + ["gpu1"] * 2 + ["gpu2"] * 2 + ["gpu3"] * 2
    assert (s.microbatches, s.schedule) == (4, "1f1b")
    assert pipeline(chain(8), C4, microbatches=4, solver="dp").stage.tolist() == s.stage.tolist()


def test_best_partition_matches_enumeration_in_simulation():
    # uneven compute: the best cut of 6 units into 3 stages is not the even one
    g = chain(6)
    g.units["fwd_flops"] = [4e12, 1e12, 1e12, 1e12, 1e12, 4e12]
    g.units["bwd_flops"] = 2 * g.units["fwd_flops"]
    c = memflow.Cluster.preset("4xV100-16GB")
    sim = memflow.sim.Simulator(g, c)
    best = None
    for cuts in itertools.combinations(range(1, 6), 2):
        stage = np.zeros(6, np.int64)
        stage[list(cuts)[0]:] += 1
        stage[list(cuts)[1]:] += 1
        s = Strategy(g.names, devices=[(f"gpu{k}",) for k in stage], stage=stage,
                     microbatches=4, schedule="1f1b")
        t = sim.evaluate(s).iteration_time
        best = t if best is None else min(best, t)
    got = pipeline(g, c, microbatches=4, stages=3)
    assert got.stage.tolist() == [0, 1, 1, 1, 1, 2]
    assert sim.evaluate(got).iteration_time == pytest.approx(best)


def test_memory_moves_the_cut_and_gpipe_holds_every_microbatch():
    g = chain(8, params=GIB // 4)
    c = memflow.Cluster.preset(C4)
    free = pipeline(g, c, microbatches=8)
    # 1F1B stage 0 holds 4 micro-batches: under a tight limit it takes fewer units
    limit = memflow.simulate(g, free, c).peak_memory.max() * 0.9
    tight = pipeline(g, c, microbatches=8, memory_limit=limit)
    assert np.bincount(tight.stage)[0] < np.bincount(free.stage)[0]
    assert memflow.simulate(g, tight, c).peak_memory.max() <= limit
    # GPipe holds all 8 micro-batches on every stage: it needs more memory than 1F1B
    gp = pipeline(g, c, microbatches=8, schedule="gpipe")
    assert (memflow.simulate(g, gp, c).peak_memory.max()
            > memflow.simulate(g, free, c).peak_memory.max())


def test_microbatch_search_and_table():
    g = chain(8)
    s = pipeline(g, C4)              # every divisor of the batch (8) is tried
    assert s.microbatches in (1, 2, 4, 8) and s.microbatches > 1
    t = pipeline_table(g, C4, microbatches=4)
    assert t.loc[("1f1b", "memflow"), "time"] <= t.loc[("1f1b", "balanced by FLOPs"), "time"]


def test_infeasible_and_inputs():
    g = chain(8)
    with pytest.raises(Infeasible) as err:
        pipeline(g, C4, memory_limit="0.5GiB")
    assert err.value.min_memory > 0.5 * GIB
    with pytest.raises(PlanError, match="must divide the graph's batch size 8"):
        pipeline(g, C4, microbatches=3)
    with pytest.raises(PlanError, match="stages=9 must be between 1 and 4"):
        pipeline(g, C4, stages=9)
    with pytest.raises(PlanError, match="unknown schedule"):
        pipeline(g, C4, schedule="zero-bubble")
    with pytest.raises(PlanError, match="stages must be a whole number"):
        pipeline(g, C4, stages="two")
    with pytest.raises(PlanError, match="time_limit must be a positive number"):
        pipeline(g, C4, time_limit=0)
    with pytest.raises(PlanError, match="memory_limit must be a positive number"):
        pipeline(g, C4, memory_limit="lots")
    # a table answers instead of raising: the row says it does not fit, with its least peak
    t = pipeline_table(g, C4, memory_limit="0.5GiB", microbatches=4, schedules=["1f1b"])
    row = t.loc[("1f1b", "memflow")]
    assert not row["fits"] and row["peak"] >= err.value.min_memory > 0.5 * GIB
