"""Fixtures of the headless widget tests: real graph, strategy, cluster and simulation; a
stand-in search until memflow.MCMCSearch lands."""
from __future__ import annotations

import pytest

import memflow

from widget_helpers import chain_graph
from widget_stand_ins import StandInSearch

GIB = 2**30


@pytest.fixture(scope="session")
def cluster():
    return memflow.Cluster.preset("2xV100-16GB")


@pytest.fixture
def graph():
    return chain_graph()


@pytest.fixture
def strategy(graph):
    return memflow.Strategy.data_parallel(graph, ["gpu0", "gpu1"]).with_policy(
        recompute=["layer2", "layer3"], offload=["layer5"])


@pytest.fixture
def result(graph, strategy, cluster):
    return memflow.simulate(graph, strategy, cluster)


@pytest.fixture
def oom_result(strategy, cluster):
    """The same strategy on a chain whose activations do not fit 16 GiB."""
    return memflow.simulate(chain_graph(unit_bytes=GIB), strategy, cluster)


@pytest.fixture
def search(graph, cluster):
    return StandInSearch(graph, cluster)
