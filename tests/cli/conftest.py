"""A small plan folder, searched once per session: chain of 4 blocks on two V100s."""
import pytest

from memflow.cli import main

SMALL = ["--model", "chain", "--option", "n=4", "--option", "width=32", "--batch", "8"]
CLUSTER = ["--cluster", "2xV100-16GB"]


@pytest.fixture(scope="session")
def plan(tmp_path_factory):
    out = tmp_path_factory.mktemp("plan")
    assert main(["search", *SMALL, *CLUSTER, "--iterations", "20", "--quiet",
                 "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="session")
def replicated(tmp_path_factory):
    """The SMALL chain as two data-parallel replicas (a search may end on one GPU)."""
    import memflow
    graph = memflow.zoo.graph("chain", batch_size=8, n=4, width=32, units="blocks")
    path = tmp_path_factory.mktemp("dp") / "strategy.json"
    memflow.Strategy.data_parallel(graph, memflow.Cluster.preset(CLUSTER[1])).to_json(path)
    return path
