"""Several chains: on a Dask cluster and in local spawn processes, sharing the best."""
import math

import pytest

from memflow.errors import SearchError
from memflow.search import MCMCSearch, run_chains

from .helpers import V100, chain

LIMIT = 0.75 * 182e6


@pytest.fixture(scope="module")
def dask_client():
    distributed = pytest.importorskip("dask.distributed")
    with distributed.LocalCluster(processes=False, n_workers=2, threads_per_worker=1,
                                  dashboard_address=None) as lc, distributed.Client(lc) as c:
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


def test_budget_is_required():
    with pytest.raises(SearchError, match="exactly one budget"):
        run_chains(chain(4), V100, chains=2)
