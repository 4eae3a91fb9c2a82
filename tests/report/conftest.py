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
    search = run_search(graph, cluster, iterations=60, progress=False)
    return write_plan(tmp_path_factory.mktemp("plan"), search, {"model": "chain", "batch": 2048})
