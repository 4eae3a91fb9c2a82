"""Hybrid projection, the statistical-efficiency models and batch rescaling."""
import math

import pandas as pd
import pytest

from memflow.errors import PlanError
from memflow.planners import CriticalBatch, Measured, at_batch, hybrid_projection
from memflow.planners.convergence import DEFAULTS, convergence_model
from memflow.planners.hybrid import SPLITS

from .graphs import chain


def test_critical_batch_and_measured_curves():
    c = CriticalBatch(b_noise=512, epochs_min=4)
    assert c(512) == 8 and c(0.5) == pytest.approx(4, rel=1e-3)
    m = Measured(pd.DataFrame({"global_batch": [100, 400], "epochs": [10, 20]}))
    assert m(200) == pytest.approx(10 * 2 ** 0.5) and m(50) == pytest.approx(10 / 2 ** 0.5)
    flat = Measured(pd.DataFrame({"global_batch": [100, 400], "epochs": [20, 10]}))
    assert flat(800) == pytest.approx(10)        # never extrapolated downwards
    assert convergence_model(None, "gnmt") is DEFAULTS["gnmt"]
    assert convergence_model(lambda b: 3.0, None)(7) == 3.0
    with pytest.raises(PlanError, match="no default convergence curve for model 'toy'"):
        convergence_model(None, "toy")
    with pytest.raises(PlanError, match="global_batch"):
        Measured(pd.DataFrame({"batch": [1, 2]}))
    with pytest.raises(PlanError, match="b_noise must be a positive finite number"):
        CriticalBatch(b_noise=0, epochs_min=1)


def test_at_batch_scales_per_sample_bytes_and_flops():
    g = chain(3, params=1000)
    g2 = at_batch(g, 24)
    assert g2.meta["batch_size"] == 24
    assert g2.units["fwd_flops"].tolist() == [3 * x for x in g.units["fwd_flops"]]
    assert g2.units["saved_bytes"].tolist() == [3 * x for x in g.units["saved_bytes"]]
    assert g2.units["param_bytes"].tolist() == g.units["param_bytes"].tolist()
    assert at_batch(g, 8) is g
    with pytest.raises(PlanError, match="batch_size must be a positive integer"):
        at_batch(g, 0)


def test_hybrid_overtakes_data_parallelism_once_batches_are_too_large():
    g = chain(4, flops=2e11, params=2 ** 24, batch=32)
    sizes = [8, 64]
    slow = hybrid_projection(g, sizes, convergence=CriticalBatch(b_noise=128, epochs_min=1),
                             samples_per_epoch=10 ** 6)
    fast = hybrid_projection(g, sizes, convergence=CriticalBatch(b_noise=1e9, epochs_min=1),
                             samples_per_epoch=10 ** 6)
    # statistics that reward small batches favour hybrid; without that, data parallelism wins
    assert (slow["best"] == "hybrid").all()
    assert (fast["best"] == "data parallel").all()
    for t in (slow, fast):
        assert t.loc[64, "dp_batch"] == 64 * 32
        assert t.loc[64, "hybrid_batch"] == 64 // t.loc[64, "hybrid_mp"] * 32
        hours = t["dp_epochs"] * 10 ** 6 / t["dp_batch"] * t["dp_step"] / 3600
        assert t["dp_hours"].tolist() == pytest.approx(hours.tolist())
        assert t["gain"].tolist() == pytest.approx((t["dp_hours"] / t["hybrid_hours"] - 1).tolist())
    assert set(slow.attrs["candidates"]["split"]) == {"data parallel", "model parallel",
                                                      "pipeline"}
    every = hybrid_projection(g, [8], convergence=CriticalBatch(b_noise=128, epochs_min=1),
                              samples_per_epoch=10 ** 6, splits=SPLITS)
    assert set(every.attrs["candidates"]["split"]) == {"data parallel", *SPLITS}
    with pytest.raises(PlanError, match="unknown split 'zero'"):
        hybrid_projection(g, [8], convergence=CriticalBatch(128, 1), samples_per_epoch=1,
                          splits=["zero"])


def test_projection_checks_its_inputs():
    g = chain(4)
    with pytest.raises(PlanError, match="samples_per_epoch"):
        hybrid_projection(g, [8], convergence=CriticalBatch(100, 1))
    with pytest.raises(PlanError, match="no default convergence curve"):
        hybrid_projection(g, [8], samples_per_epoch=100)
    with pytest.raises(PlanError, match="whole number of 8-GPU nodes"):
        hybrid_projection(g, [12], convergence=CriticalBatch(100, 1), samples_per_epoch=100)
    with pytest.raises(PlanError, match="mp_degrees must be device counts >= 2"):
        hybrid_projection(g, [8], convergence=CriticalBatch(100, 1), samples_per_epoch=100,
                          mp_degrees=[1])
    with pytest.raises(PlanError, match="positive device counts"):
        hybrid_projection(g, [], convergence=CriticalBatch(100, 1), samples_per_epoch=100)


def test_memory_decides_feasibility():
    # 3 GiB of weights per unit (+ gradients + DDP buckets): a 16 GiB V100 holds one unit only
    g = chain(4, params=3 * 2 ** 30, batch=8)
    t = hybrid_projection(g, [8], convergence=CriticalBatch(10 ** 6, 1), samples_per_epoch=100)
    assert math.isnan(t.loc[8, "dp_hours"]) and t.loc[8, "best"] == "hybrid"
    assert t.loc[8, "hybrid_mp"] == 4


@pytest.mark.parametrize("bad, field", [
    (pd.DataFrame({"global_batch": [256, 1024], "epochs": [10, float("nan")]}), "'epochs'"),
    (pd.DataFrame({"global_batch": [256, -1], "epochs": [10, 12]}), "'global_batch'"),
    (pd.DataFrame({"global_batch": [256, "x"], "epochs": [10, 12]}), "'global_batch'"),
    (pd.DataFrame({"global_batch": [256, 256], "epochs": [10, 12]}), "two distinct"),
])
def test_bad_measurements_name_the_field(bad, field):
    with pytest.raises(PlanError, match=field):
        Measured(bad)
    g = chain(4)
    with pytest.raises(PlanError, match=field):
        hybrid_projection(g, [8], convergence=bad, samples_per_epoch=100)


def test_bad_curves_and_functions_are_plan_errors():
    for kwargs, field in (({"b_noise": float("nan"), "epochs_min": 1}, "b_noise"),
                          ({"b_noise": 10, "epochs_min": "x"}, "epochs_min")):
        with pytest.raises(PlanError, match=field):
            CriticalBatch(**kwargs)
    g = chain(4)
    with pytest.raises(PlanError, match="at global batch 64 must be a positive finite"):
        hybrid_projection(g, [8], convergence=lambda b: -1.0, samples_per_epoch=100)
    with pytest.raises(PlanError, match="samples_per_epoch must be a positive whole number"):
        hybrid_projection(g, [8], convergence=CriticalBatch(100, 1), samples_per_epoch=-5)


def test_user_measurements_replace_the_default_curve():
    # measured epochs that grow steeply with the batch make the smaller hybrid batch win
    g = chain(4, flops=2e11, params=2 ** 24, batch=32, model="gnmt")
    steep = pd.DataFrame({"global_batch": [32, 256], "epochs": [1, 64]})
    t = hybrid_projection(g, [8], convergence=steep, samples_per_epoch=10 ** 6)
    m = Measured(steep)
    assert t.loc[8, "dp_epochs"] == pytest.approx(m(256))
    assert t.loc[8, "hybrid_epochs"] == pytest.approx(m(t.loc[8, "hybrid_batch"]))
    assert t.loc[8, "best"] == "hybrid"
    default = hybrid_projection(g, [8], samples_per_epoch=10 ** 6)     # gnmt's default curve
    assert default.loc[8, "dp_epochs"] == pytest.approx(DEFAULTS["gnmt"](256))


def test_none_fits_gives_the_smallest_memory_found():
    g = chain(2, params=20 * 2 ** 30, batch=8)      # 20 GiB of weights per unit, 2 units
    t = hybrid_projection(g, [2], convergence=CriticalBatch(10 ** 6, 1), samples_per_epoch=100,
                          mp_degrees=[2])
    assert t.loc[2, "best"] == "none fits"
    cand = t.attrs["candidates"]
    assert t.loc[2, "min_peak"] == cand["peak"].min() > 16 * 2 ** 30
