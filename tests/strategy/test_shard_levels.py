"""Shard levels, precision and optimizer offload as strategy fields (issue 12 item 1)."""
import json

import pytest

from memflow.errors import FileFormatError, StrategyError
from memflow.strategy import SHARD_LEVELS, Strategy


def _dp(n=2):
    return Strategy(["a", "b", "c"], devices=[tuple(f"gpu{i}" for i in range(n))] * 3,
                    sample=[n] * 3)


def test_default_is_unsharded_and_old_documents_read_so():
    s = _dp()
    assert s.shard_levels == ["none"] * 3 and s.precision is None
    assert not s.offload_optimizer.any()
    doc = s.to_dict()
    assert "shard" not in doc and "precision" not in doc and "offload_optimizer" not in doc
    assert Strategy.from_dict(doc) == s


def test_round_trip_and_equality():
    s = _dp().with_shard({"a": "optimizer", "c": "parameters"}).with_model_states(
        precision="bf16", offload_optimizer=["b"])
    doc = json.loads(s.to_json())
    assert doc["shard"] == ["optimizer", "none", "parameters"]
    assert doc["precision"] == "bf16" and doc["offload_optimizer"] == [False, True, False]
    back = Strategy.from_json(s.to_json())
    assert back == s and back != _dp()
    t = s.table
    assert t["shard"].tolist() == ["optimizer", "none", "parameters"]
    assert t["offload_optimizer"].tolist() == [False, True, False]


def test_errors_name_unit_and_valid_levels():
    with pytest.raises(StrategyError, match=r"unit 'b': unknown shard level 'zero2'; valid: "
                       + ", ".join(SHARD_LEVELS)):
        _dp().with_shard({"b": "zero2"})
    doc = {**_dp().to_dict(), "shard": ["none", "full", "none"]}
    with pytest.raises(FileFormatError, match=r"s.json: field 'shard' must be one of none, "
                       r"optimizer, gradients, parameters, got 'full' for unit 'b'"):
        Strategy.from_dict(doc, source="s.json")
    with pytest.raises(FileFormatError, match="field 'precision'"):
        Strategy.from_dict({**_dp().to_dict(), "precision": "fp8"}, source="s.json")
    with pytest.raises(StrategyError, match="unknown precision 'fp8'; valid: fp32, amp, bf16"):
        _dp().with_model_states(precision="fp8")


def test_data_parallel_shard():
    import memflow
    g = memflow.zoo.graph("chain", batch_size=8, n=3, width=16)
    s = Strategy.data_parallel(g, 4, shard="gradients")
    assert set(s.shard_levels) == {"gradients"} and s.name == "data parallel, shard gradients"
    assert Strategy.data_parallel(g, 4).name == "data parallel"


def test_repr_names_model_state_choices_only_when_set():
    s = _dp()
    assert "shard" not in repr(s) and "bf16" not in repr(s)
    t = s.with_shard("parameters", ["a"]).with_model_states(precision="bf16",
                                                           offload_optimizer=["c"])
    assert "shard parameters 1, optimizer on host 1, bf16" in repr(t)
