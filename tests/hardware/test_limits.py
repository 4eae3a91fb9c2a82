"""One reader of memory limits: every form it accepts, and the one message for what it does not."""
import math

import pytest

from memflow.errors import ClusterError
from memflow.hardware import Cluster, memory_limits

FOUR = Cluster.preset("4xV100-16GB")
CAP = 16 * 2 ** 30


@pytest.mark.parametrize("limit, expect", [
    (None, CAP),
    (8e9, 8e9),
    ("8GB", 8e9),
    ("8 GiB", 8 * 2 ** 30),
    (1, 1.0),                       # a whole byte: numbers of 1 and over are bytes
    (0.25, CAP / 4),                # under one byte means a fraction of the capacity
    ("25%", CAP / 4),
    ("0.25", CAP / 4),
    ("64GB", CAP),                  # never above the capacity
    (math.inf, CAP),
])
def test_every_form_gives_bytes_per_device(limit, expect):
    assert memory_limits(FOUR, limit).tolist() == [expect] * 4


def test_a_mapping_limits_the_devices_it_names():
    got = memory_limits(FOUR, {"gpu1": "1GB", "gpu2": "50%", "gpu3": None})
    assert got.tolist() == [CAP, 1e9, CAP / 2, CAP]


@pytest.mark.parametrize("limit, fault", [
    ("lots", "'lots'"), (0, "0"), (-2e9, "-2000000000.0"), ("-5%", "'-5%'"),
    (math.nan, "nan"), (True, "True"), ([1], r"\[1\]"),
    ({"gpu0": "x"}, r"'x' \(for device 'gpu0'\)"),
])
def test_one_message_names_the_value_and_what_is_valid(limit, fault):
    with pytest.raises(ClusterError, match=f"cannot read a size from {fault}.*: memory_limit must "
                                           "be a positive number of bytes, .* or '80%'"):
        memory_limits(FOUR, limit)


def test_an_unknown_device_is_named_with_the_devices_there_are():
    with pytest.raises(ClusterError, match="names device 'gpu9'.*'gpu0', 'gpu1'"):
        memory_limits(FOUR, {"gpu9": "1GB"})
