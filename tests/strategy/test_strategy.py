"""Strategy: constructors, modification, JSON round trip, validation errors."""
import numpy as np
import pytest
from hypothesis import given, settings

import memflow
from memflow.errors import FileFormatError, StrategyError
from memflow.strategy import Strategy
from sim.graphs import chain, graphs, strategies_for

DEVICES = [f"gpu{i}" for i in range(8)]


@settings(max_examples=60)
@given(graphs().flatmap(lambda g: strategies_for(g, DEVICES)))
def test_json_round_trip_is_exact(s):
    again = Strategy.from_json(s.to_json())
    assert again == s and hash(again) == hash(s)
    assert again.table.equals(s.table)


def test_file_round_trip_and_corrupt_file(tmp_path):
    g = chain()
    s = Strategy.data_parallel(g, 2).with_policy({"u1": "compress:0.001"})
    path = s.to_json(tmp_path / "s.json")
    assert Strategy.from_json(path) == s
    path.write_text("{oops")
    with pytest.raises(FileFormatError, match="s.json"):
        Strategy.from_json(path)


def test_segments_follow_runs_of_recompute():
    g = chain(saved=(1,) * 6, internal=(1,) * 6)
    s = Strategy.single_device(g).with_policy(recompute=["u0", "u1", "u3"])
    assert s.segment.tolist() == [0, 0, -1, 1, -1, -1]
    # a placement change breaks a segment
    s2 = s.with_config("u1", devices=["gpu1"])
    assert s2.segment.tolist() == [0, 1, -1, 2, -1, -1]
    assert s2.policy is s.policy and not s.policy.flags.writeable   # shared, read-only


def test_constructors():
    g = chain(saved=(1,) * 8, internal=(1,) * 8)
    dp = Strategy.data_parallel(g, 4)
    assert (dp.sample == 4).all() and dp.devices[0] == ("gpu0", "gpu1", "gpu2", "gpu3")
    mp = Strategy.model_parallel(g, 4)
    assert [d[0] for d in mp.devices] == ["gpu0"] * 2 + ["gpu1"] * 2 + ["gpu2"] * 2 + ["gpu3"] * 2
    hy = Strategy.hybrid(g, 8, dp=2, mp=4)
    assert hy.devices[0] == ("gpu0", "gpu4") and hy.devices[-1] == ("gpu3", "gpu7")
    pp = memflow.strategy.pipeline(g, 2, stages=2, microbatches=4)
    assert pp.stage.tolist() == [0] * 4 + [1] * 4 and pp.microbatches == 4
    units = g.units.copy()
    units["max_parameter_degree"] = 8
    from memflow.graph import OpGraph
    g2 = OpGraph(units, g.tensors.drop(columns=["first_saver", "last_consumer"]), g.meta)
    tp = Strategy.tensor_parallel(g2, 16, tp=2, pp=2, dp=4, microbatches=2)
    assert tp.parameter.tolist() == [2] * 8
    assert tp.devices[0] == ("gpu0", "gpu1", "gpu4", "gpu5", "gpu8", "gpu9", "gpu12", "gpu13")
    tp.validate(g2)


@pytest.mark.parametrize("change, match", [
    (lambda s: s.with_config("u1", sample=2), "1 devices are listed"),
    (lambda s: s.with_config("u1", parameter=2, devices=["gpu0", "gpu1"]), "max_parameter_degree 1"),
    (lambda s: s.with_config("u1", devices=["tpu9"]), "'tpu9' is not in the cluster"),
    (lambda s: s.with_config("u1", stage=1), "no pipeline stage"),
    (lambda s: s.with_config("u1", sample=2, devices=["gpu0", "gpu0"]), "appears twice"),
    (lambda s: s.with_schedule(microbatches=16), "exceeds the batch of 8"),
])
def test_validate_names_the_unit_and_what_is_valid(change, match):
    g = chain()
    c = memflow.Cluster.preset("4xV100-16GB")
    with pytest.raises(StrategyError, match=match):
        change(Strategy.single_device(g)).validate(g, c)


def test_bad_names_and_policies():
    s = Strategy.single_device(chain())
    with pytest.raises(StrategyError, match="'u9' is not a unit"):
        s.with_policy({"u9": "keep"})
    with pytest.raises(StrategyError, match="unknown memory policy 'swap'"):
        s.with_policy({"u0": "swap"})
    with pytest.raises(StrategyError, match="error bound > 0"):
        s.with_policy({"u0": "compress:-1"})
    assert np.isnan(s.with_policy(offload="u0").error_bound).all()


def test_segment_breaks_split_runs_and_survive_copies_and_json():
    g = chain(saved=(1,) * 5, internal=(1,) * 5)
    s = Strategy.single_device(g).with_policy(recompute=["u0", "u1", "u2", "u4"])
    assert not s.segment_break.any() and "segment_break" not in s.to_dict()   # old format
    each = s.with_segments("each")
    assert each.segment.tolist() == [0, 1, 2, -1, 3]
    assert each.segment_break.tolist() == [False, True, True, False, False]
    assert each.table["segment_break"].tolist() == each.segment_break.tolist()
    assert each != s and hash(each) != hash(s)
    assert each.with_segments("runs") == s
    assert s.with_segments(["u2"]).segment.tolist() == [0, 0, 1, -1, 2]
    again = Strategy.from_json(each.to_json())
    assert again == each and again.table.equals(each.table)
    # copies carry the breaks; a unit that stops being recomputed drops its break
    moved = each.with_config("u3", devices=["gpu1"]).with_schedule(name="x")
    assert moved.segment_break is each.segment_break
    kept = each.with_policy(keep=["u1"])
    assert kept.segment_break.tolist() == [False, False, True, False, False]
    assert kept.segment.tolist() == [0, -1, 1, -1, 2]
    assert kept.with_policy(recompute=["u1"]).segment.tolist() == [0, 0, 1, -1, 2]


def test_segment_break_on_a_unit_not_recomputed_is_rejected():
    g = chain()
    s = Strategy.single_device(g)
    with pytest.raises(StrategyError, match="unit 'u1': a segment break on a unit whose policy "
                                            "is 'keep'"):
        s.with_segments(["u1"])
    doc = s.with_policy(recompute=["u0", "u1"]).with_segments("each").to_dict()
    doc["policy"] = ["recompute", "offload", "keep"]
    with pytest.raises(StrategyError, match="unit 'u1'.*'offload'"):
        Strategy.from_dict(doc)


def test_sequence_parallel_round_trips_and_sits_on_split_units_only():
    g = chain()
    s = Strategy.single_device(g).with_config("u1", parameter=2, devices=["gpu0", "gpu1"],
                                              sequence_parallel=True)
    assert s.sequence_parallel.tolist() == [False, True, False]
    again = Strategy.from_json(s.to_json())
    assert again == s and again.table["sequence_parallel"].tolist() == [False, True, False]
    assert "sequence_parallel" not in Strategy.single_device(g).to_dict()  # old documents
    # unsplit, the unit drops it; set on an unsplit unit, it is an error naming the unit
    assert not s.with_config("u1", parameter=1, devices=["gpu0"]).sequence_parallel.any()
    with pytest.raises(StrategyError, match="unit 'u0': sequence_parallel on a unit with "
                                            "parameter degree 1"):
        s.with_config("u0", sequence_parallel=True)
    doc = {**s.to_dict(), "sequence_parallel": [True, True, False]}
    with pytest.raises(StrategyError, match="s.json: unit 'u0': sequence_parallel"):
        Strategy.from_dict(doc, source="s.json")
    with pytest.raises(FileFormatError, match="sequence_parallel"):
        Strategy.from_dict({**doc, "sequence_parallel": [1, "yes", 0]}, source="s.json")
    # export runs it on split blocks and normalizations of the tensor-parallel path only
    # (memflow.strategy.sequence_parallel): not on a Linear unit, which the graph tells
    from memflow.strategy.runnable import unrunnable
    assert unrunnable(s) is None
    assert "unit 'u1' is sequence parallel, but it is no block" in unrunnable(s, g)
