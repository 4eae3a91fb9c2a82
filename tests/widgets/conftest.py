"""Fixtures of the headless widget tests: a real graph and strategy, a result and a search."""
from __future__ import annotations

import pytest

import memflow

from widget_helpers import chain_graph
from widget_stand_ins import StandInSearch, sim_result


@pytest.fixture
def graph():
    return chain_graph()


@pytest.fixture
def strategy(graph):
    return memflow.Strategy.data_parallel(graph, ["gpu0", "gpu1"]).with_policy(
        recompute=["layer2", "layer3"], offload=["layer5"])


@pytest.fixture
def result(graph, strategy):
    return sim_result(graph, strategy)


@pytest.fixture
def search(graph):
    return StandInSearch(graph)
