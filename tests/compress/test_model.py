"""The simulator's view of compression: ratio curve, throughput model, measure()."""
import math

import pytest
import torch

from memflow.compress import THROUGHPUT, expected_ratio, launches, measure, throughput
from memflow.compress.model import MEASURED


def test_ratio_falls_as_the_bound_tightens_and_matches_the_measured_table():
    bounds = [1.0, 0.1, 0.03, 0.01, 3e-3, 1e-3, 1e-4, 1e-5, 1e-6]
    ratios = [expected_ratio(b) for b in bounds]
    assert ratios == sorted(ratios, reverse=True)
    for (relative, lossless), table in MEASURED.items():
        for eb, bits in table.items():
            assert expected_ratio(eb, relative=relative, lossless=lossless) == \
                pytest.approx(32 / bits)
    assert expected_ratio(1e-2, lossless=True) > expected_ratio(1e-2)


def test_ratio_depends_on_the_dtype_and_degrades_to_raw():
    assert expected_ratio(1e-2, "float16") == pytest.approx(expected_ratio(1e-2) / 2)
    assert expected_ratio(1e-2, "torch.bfloat16") == expected_ratio(1e-2, "float16")
    assert expected_ratio(1e-9) == 1.0 and expected_ratio(1e-5, "float16") == 1.0
    assert expected_ratio(0.0) == 1.0 and expected_ratio(math.nan) == 1.0


def test_throughput_is_memory_bound():
    assert throughput(2e12) == pytest.approx(2 * throughput(1e12))
    assert throughput(1e12, bits=6) > throughput(1e12, bits=13)
    assert throughput(1e12, bits=9, decompress=True) > throughput(1e12, bits=9)
    assert 1e9 < THROUGHPUT < 1e11
    assert launches(16) > launches(6)


def test_measure_reports_both_ratios_and_the_error():
    torch.manual_seed(0)
    m = measure(torch.relu(torch.randn(256, 256)), 1e-2)
    assert m["max_error"] <= 1e-2 and m["error_bound"] == 1e-2
    assert m["ratio_lossless"] > m["ratio"] > 2
    assert m["throughput"] > 0 and m["decompress_throughput"] > 0
    r = measure(torch.randn(1000, dtype=torch.float16), 1e-2, relative=True)
    assert r["dtype"] == "float16" and r["max_error"] <= r["error_bound"]
