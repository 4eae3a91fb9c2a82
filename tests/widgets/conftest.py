"""Fixtures of the headless widget tests: the real graph, strategy, cluster, simulation and
search of memflow (a small chain built without capture, so no model needs tracing)."""
from __future__ import annotations

import pytest

import memflow

from widget_helpers import Recording, chain_graph

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
    return memflow.MCMCSearch(graph, cluster, seed=0)


@pytest.fixture
def recording(search):
    return Recording(search)
