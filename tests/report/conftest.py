"""A searched plan on a small model where memory matters: chain of 6 blocks on two V100s
capped at a budget that data parallel does not fit."""
import pytest

import memflow
from memflow.cli.folder import run_search, write_plan


@pytest.fixture(scope="session")
def graph():
    return memflow.zoo.graph("chain", batch_size=2048, n=6, width=64, units="blocks")


@pytest.fixture(scope="session")
def cluster():
    return memflow.Cluster.preset("2xV100-16GB").with_memory("2.2MB")   # data parallel peaks at 2.8 MB


@pytest.fixture(scope="session")
def plan(tmp_path_factory, graph, cluster):
    # from data parallel (2.8 MB), 100 proposals reach a plan within 2.2 MB (60 no longer
    # did once a sharded unit starts a recompute segment)
    search = run_search(graph, cluster, iterations=100, progress=False)
    return write_plan(tmp_path_factory.mktemp("plan"), search, {"model": "chain", "batch": 2048})
