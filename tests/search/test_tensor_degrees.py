"""The search's parallel moves keep every parameter degree dividing its unit's
``tensor_degree`` (capture's record of how far Megatron splits a block's heads and widths), and
validation refuses a strategy that breaks this, naming the unit and the valid degrees."""
import functools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import memflow
from memflow.errors import StrategyError
from memflow.search.moves import MOVES, PARALLEL_MOVES
from memflow.search.space import SearchSpace
from memflow.strategy import Strategy
from memflow.strategy.validate import divides_tensor_degree

CLUSTER = memflow.Cluster.preset("4xV100-16GB")


@functools.lru_cache(maxsize=1)
def _graph():
    # 6 heads, 3 key/value heads: each decoder layer splits 1 or 3 ways, never 2 or 4
    return memflow.zoo.graph("tinyllama-1.1b", batch_size=4, units="blocks", vocab=40,
                             hidden=24, n_layer=2, n_head=6, n_kv_head=3, ffn=48, seq_len=6)


def test_validation_names_the_unit_the_degree_and_the_valid_ones():
    g = _graph()
    assert g.units.loc["layers.0", "tensor_degree"] == 3
    s = Strategy.data_parallel(g, 4).with_config("layers.0", sample=2, parameter=2)
    with pytest.raises(StrategyError, match=r"unit 'layers.0': parameter degree 2 does not "
                       r"divide its tensor_degree 3 .*valid: parameter 1, 3"):
        s.validate(g)
    # the constructor splits only the units tp divides
    tp = Strategy.tensor_parallel(g, 2, tp=2).validate(g)
    assert tp.parameter[g.names.index("layers.0")] == 1 and tp.parameter.max() == 2


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), runnable=st.booleans(),
       start=st.sampled_from(["single", "data", "tensor"]))
def test_walked_moves_keep_degrees_dividing_tensor_degree(seed, runnable, start):
    g = _graph()
    space = SearchSpace(g, CLUSTER, runnable=runnable)
    rng = np.random.default_rng(seed)
    s = {"single": Strategy.single_device(g), "data": Strategy.data_parallel(g, 4),
         "tensor": Strategy.tensor_parallel(g, 4, tp=4)}[start]
    td = g.units["tensor_degree"].to_numpy()
    for _ in range(30):
        p = MOVES[PARALLEL_MOVES[int(rng.integers(len(PARALLEL_MOVES)))]](rng, s, space)
        if p is None:
            continue
        s = p.strategy
        assert divides_tensor_degree(td, s.parameter).all(), (p.move, p.unit, s.parameter)
        s.validate(g)
