"""The one evaluator: what the planners and the search are told of a strategy agrees with the
simulator, against the limit every one of them reads the same way."""
import numpy as np
import pytest

from memflow.hardware.presets import build
from memflow.sim import Evaluator, Simulator
from memflow.strategy import Strategy

from .graphs import chain, cluster


def test_outcomes_agree_with_the_simulator_and_are_remembered():
    g, c = chain(), cluster("4xV100-16GB")
    ev = Evaluator(g, c)
    s = Strategy.data_parallel(g, ["gpu1", "gpu2"])
    out = ev(s)
    plain = Simulator(g, c).evaluate(s)
    assert out.time == plain.iteration_time and np.array_equal(out.peaks, plain.peak)
    assert out.fits == plain.feasible and out.peak == plain.peak.max() and out.over == 0
    assert out.peaks[0] == out.peaks[3] == 0          # devices it does not use hold nothing
    assert ev(s) is out and ev.simulations == 1


def test_a_limit_is_per_device_and_over_is_the_worst_relative_excess():
    g, c = chain(), cluster("4xV100-16GB")
    peak = Evaluator(g, c)(Strategy.single_device(g)).peak
    ev = Evaluator(g, c, {"gpu0": peak / 2})
    out = ev(Strategy.single_device(g))
    assert not out.fits and out.over == pytest.approx(1.0)
    assert ev(Strategy.single_device(g, "gpu1")).fits
    assert Evaluator(g, c, {"gpu0": peak})(Strategy.single_device(g)).fits   # at the limit fits


@pytest.mark.parametrize("host_memory, fits", [(219, False), (220, True)])
def test_offloads_must_fit_their_host(host_memory, fits):
    g = chain()
    c = build("V100-16GB", 1, host_memory=host_memory)
    s = Strategy.single_device(g).with_policy(offload=["u1"])
    assert Evaluator(g, c)(s).fits is fits
    assert Simulator(g, c).evaluate(s).feasible is fits
