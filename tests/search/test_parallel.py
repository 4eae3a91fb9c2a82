"""Several chains: on a Dask cluster and in local spawn processes, sharing the best."""
import math

import pytest

from memflow.errors import SearchError
from memflow.search import MCMCSearch, run_chains

from .helpers import V100, chain

LIMIT = 0.75 * 182e6


@pytest.fixture(scope="module")
def dask_cluster():
    """Two worker threads behind a scheduler listening on TCP, as a remote one would."""
    distributed = pytest.importorskip("dask.distributed")
    with distributed.LocalCluster(processes=False, n_workers=2, threads_per_worker=1,
                                  protocol="tcp://", host="127.0.0.1",
                                  dashboard_address=None) as lc:
        yield lc


@pytest.fixture(scope="module")
def dask_client(dask_cluster):
    from dask.distributed import Client
    with Client(dask_cluster) as c:
        yield c


def test_dask_chains_share_their_best(dask_client):
    g = chain(8)
    res = run_chains(g, V100, chains=2, iterations=120, rounds=3, client=dask_client,
                     memory_limit=LIMIT, policies=("keep", "recompute"))
    assert res.rounds["round"].tolist() == [0, 0, 1, 1, 2, 2]
    assert res.history.groupby("chain").size().tolist() == [120, 120]
    assert math.isfinite(res.best_cost) and res.best_score.feasible
    per_round = res.rounds.groupby("round")["best_cost"].min()
    assert per_round.is_monotonic_decreasing or per_round.nunique() == 1
    # after sharing, no chain ends worse than the best of the round before
    last = res.rounds[res.rounds["round"] == 2]["best_cost"]
    assert (last <= per_round.loc[1] + 1e-15).all()
    assert res.best_cost == min(res.rounds["best_cost"])
    # the exchange is recorded: a chain adopts the best only when another chain's was better
    assert not res.rounds.loc[res.rounds["round"] == 0, "adopted"].any()
    for r in (1, 2):
        before = res.rounds[res.rounds["round"] == r - 1].set_index("chain")["best_cost"]
        adopted = res.rounds[res.rounds["round"] == r].set_index("chain")["adopted"]
        assert (~adopted | (before > before.min())).all()
    # a chain handed back resumes here, with its whole history
    resumed = res.search(1, g, V100)
    assert isinstance(resumed, MCMCSearch) and resumed.iteration == 120
    assert len(resumed.step(5).history) == 125


def test_same_seed_same_result_in_processes_and_on_dask(dask_client):
    g = chain(6)
    kw = dict(chains=2, iterations=40, rounds=2, memory_limit=0.8 * 130e6, seed=4)
    local = run_chains(g, V100, **kw)
    remote = run_chains(g, V100, client=dask_client, **kw)
    assert local.best == remote.best and local.best_cost == remote.best_cost
    cols = ["chain", "iteration", "move", "unit", "cost", "accepted"]
    assert local.history[cols].equals(remote.history[cols])


def test_a_scheduler_address_runs_the_same_chains(dask_cluster, dask_client):
    g = chain(6)
    kw = dict(chains=2, iterations=40, rounds=2, memory_limit=0.8 * 130e6, seed=4)
    by_address = run_chains(g, V100, scheduler=dask_cluster.scheduler_address, **kw)
    assert dask_cluster.scheduler_address.startswith("tcp://")
    by_client = run_chains(g, V100, client=dask_client, **kw)
    assert by_address.best == by_client.best and by_address.best_cost == by_client.best_cost
    assert by_address.rounds["adopted"].tolist() == by_client.rounds["adopted"].tolist()


def test_a_scheduler_nobody_runs_is_named():
    dask = pytest.importorskip("dask")
    with dask.config.set({"distributed.comm.timeouts.connect": "1s"}), \
            pytest.raises(SearchError, match="no dask.distributed scheduler answers at"):
        run_chains(chain(4), V100, chains=2, iterations=4, scheduler="tcp://127.0.0.1:9",
                   memory_limit=LIMIT)
    with pytest.raises(SearchError, match="client= or scheduler="):
        run_chains(chain(4), V100, chains=2, iterations=4, scheduler="tcp://127.0.0.1:9",
                   client=object())


def test_budget_is_required():
    with pytest.raises(SearchError, match="exactly one budget"):
        run_chains(chain(4), V100, chains=2)
