"""Every move proposes a valid, different strategy and never touches a pinned unit."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import memflow
from memflow.search.moves import GLOBAL_MOVES, MOVES
from memflow.search.space import SearchSpace
from memflow.search.synthetic import chain_graph

FOUR = memflow.Cluster.preset("4xV100-16GB")


def _unit_state(s, i):
    return (s.policies[i], float(np.nan_to_num(s.error_bound[i])), int(s.sample[i]),
            int(s.parameter[i]), int(s.attribute[i]), s.devices[i], int(s.stage[i]))


@settings(max_examples=12)
@given(n=st.integers(2, 6), seed=st.integers(0, 2**16), pins=st.sets(st.integers(0, 5)),
       batch=st.sampled_from([1, 2, 8, 64]))
def test_random_walks_stay_valid_and_respect_pins(n, seed, pins, batch):
    g = chain_graph(n, batch=batch, width=16, seed=seed)
    space = SearchSpace(g, FOUR, policies=("keep", "recompute", "offload", "compress"),
                        error_bounds=(1e-3, 1e-2))
    pinned = sorted(p for p in pins if p < n)
    space.pinned[pinned] = True
    rng = np.random.default_rng(seed)
    s = memflow.Strategy.single_device(g)
    frozen = {i: _unit_state(s, i) for i in pinned}
    for _ in range(60):
        name = list(MOVES)[int(rng.integers(len(MOVES)))]
        prop = MOVES[name](rng, s, space)
        if prop is None:
            continue
        assert prop.move == name and prop.strategy != s
        if prop.move in GLOBAL_MOVES:      # changes the whole strategy, names no unit
            assert prop.unit == ""
        else:
            assert prop.unit in g.names and not space.pinned[g.names.index(prop.unit)]
        prop.strategy.validate(g, FOUR)
        s = prop.strategy
        assert {i: _unit_state(s, i) for i in pinned} == frozen


@settings(max_examples=25)
@given(n=st.integers(2, 6), seed=st.integers(0, 2**16),
       policies=st.lists(st.sampled_from(["keep", "recompute", "offload", "compress"]),
                         min_size=1, max_size=4, unique=True),
       fixed=st.sets(st.integers(0, 5), max_size=2), devices=st.sampled_from([1, 4]))
def test_proposals_stay_within_the_space_policies(n, seed, policies, fixed, devices):
    """With the search restricted to some policies (issue 16: ``("keep", "offload")`` still
    grew recompute segments), no move gives a unit a policy outside them, from any start."""
    g = chain_graph(n, batch=8, width=16, seed=seed)
    g.units["recomputable"] = [i not in fixed for i in range(n)]
    cluster = FOUR if devices == 4 else memflow.Cluster.preset("1xV100-16GB")
    space = SearchSpace(g, cluster, policies=policies, error_bounds=(1e-3,))
    rng = np.random.default_rng(seed)
    # a start that holds every policy, recompute segments included, to leave or keep
    start = rng.choice(["keep", "recompute", "offload"], n).tolist()
    s = memflow.Strategy.single_device(g).with_policy(
        {u: p if p != "recompute" or i not in fixed else "keep"
         for i, (u, p) in enumerate(zip(g.names, start))})
    for _ in range(60):
        name = list(MOVES)[int(rng.integers(len(MOVES)))]
        prop = MOVES[name](rng, s, space)
        if prop is None:
            continue
        for i in range(n):
            if _unit_state(prop.strategy, i)[:2] != _unit_state(s, i)[:2]:
                got = prop.strategy.policies[i]
                assert got in policies, (name, g.names[i], got, policies)
                assert got != "recompute" or i not in fixed
        s = prop.strategy
    if "recompute" not in policies:
        assert MOVES["segment"](rng, s, space) is None


@settings(max_examples=15, deadline=None)
@given(n=st.integers(2, 6), seed=st.integers(0, 2**16))
def test_on_replicas_places_each_unit_as_the_per_unit_rule_does(n, seed):
    """SearchSpace.on_replicas (one pass over the arrays) gives every unit what the per-unit
    rule gives: its parameter degree lowered until ``sample × parameter`` parts divide the
    device count and the unit may take it, no attribute split, on the aligned run of devices
    holding its first device, sequence parallelism dropped where it is no longer split."""
    g = chain_graph(n, batch=8)
    space = SearchSpace(g, memflow.Cluster.preset("4xV100-16GB"), runnable=False)
    rng = np.random.default_rng(seed)
    s = memflow.Strategy.single_device(g)
    for _ in range(6):
        prop = MOVES["config"](rng, s, space)
        s = prop.strategy if prop is not None else s
    for sample in space.sample_degrees(s.microbatches):
        out = space.on_replicas(s, sample)
        for i in range(n):
            p = min(int(s.parameter[i]), int(space.max_p[i]))
            while p > 1 and (sample * p not in space.part_counts or not space.fits(i, p)):
                p -= 1
            first = space.devices.index(s.devices[i][0])
            assert (int(out.sample[i]), int(out.parameter[i]), int(out.attribute[i])) == \
                (sample, p, 1)
            assert out.devices[i] == space.groups(sample * p)[first // (sample * p)]
        assert out.stage.tolist() == s.stage.tolist()
