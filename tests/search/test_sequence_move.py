"""Sequence parallelism in the search space (issue 14): where export runs it
(``memflow.strategy.sequence_parallel``), the ``sequence`` move that sets it, and the moves
that would leave it where export does not run it, which drop it."""
import functools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import memflow
from memflow.search.mcmc import MCMCSearch
from memflow.search.moves import MOVES, Proposal
from memflow.search.space import SearchSpace
from memflow.search.synthetic import chain_graph
from memflow.strategy.runnable import sequence_problem, unrunnable
from memflow.zoo.llama import TINY_ARCH

TWO = memflow.Cluster.preset("2xV100-16GB")


@functools.cache
def llama(seq_len: int = 6):
    return memflow.zoo.graph("tinyllama-1.1b", batch_size=4, units="blocks",
                             **{**TINY_ARCH, "seq_len": seq_len})


def start(g=None):
    """Megatron's tensor and sequence parallelism on two devices, in the runnable space (the
    final norm unsplit: the search splits no normalization)."""
    g = g or llama()
    return SearchSpace(g, TWO).project(memflow.Strategy.tensor_parallel(
        g, TWO, tp=2, sequence_parallel=True))


def test_sequence_parallelism_runs_on_split_blocks_of_the_tensor_path_only():
    g, s = llama(), start()
    assert s.sequence_parallel.tolist() == [False, False, True, True, False, False]
    assert unrunnable(s, g) is None
    assert "'layers.0' is split over parameters and offloaded" in \
        unrunnable(s.with_policy(offload=["layers.0"]), g)
    assert "'layers.1' is a split block and recomputed" in \
        unrunnable(s.with_policy(recompute=["layers.1"]), g)
    # the second block's ranks swapped: two tensor-parallel groups, not the tensor path
    assert "export runs one tensor-parallel group per replica" in \
        sequence_problem(s.with_config("layers.1", devices=["gpu1", "gpu0"]), g)
    odd = llama(seq_len=5)      # 5 tokens do not split over 2 ranks
    assert "its sequence of 5 does not split 2 ways" in unrunnable(
        memflow.Strategy.tensor_parallel(odd, TWO, tp=2, sequence_parallel=True).with_config(
            "norm", parameter=1, devices=["gpu0"]), odd)
    assert "no block Megatron splits" in unrunnable(s.with_config(
        "lm_head", sequence_parallel=True), g)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**16))
def test_moves_keep_sequence_parallelism_where_export_runs_it(seed):
    """From tensor and sequence parallelism, every proposal of every move runs: a move that
    would leave it where export does not (a part moved off the group, a split block
    recomputed or offloaded) proposes the strategy without it."""
    g = llama()
    space = SearchSpace(g, TWO)
    rng = np.random.default_rng(seed)
    s = start(g)
    names = list(MOVES)
    for _ in range(30):
        prop = MOVES[names[int(rng.integers(len(names)))]](rng, s, space)
        if prop is None:
            continue
        assert isinstance(prop, Proposal) and prop.strategy != s
        assert unrunnable(prop.strategy, g) is None, prop.move
        s = prop.strategy


def test_the_sequence_move_turns_it_on_and_off():
    g = llama()
    space = SearchSpace(g, TWO)
    s = start(g).with_config(["layers.0", "layers.1"], sequence_parallel=False)
    rng = np.random.default_rng(0)
    on = MOVES["sequence"](rng, s, space).strategy
    assert on.sequence_parallel.sum() == 1 and unrunnable(on, g) is None
    off = MOVES["sequence"](np.random.default_rng(0), on, space)
    assert off is None or off.strategy.sequence_parallel.sum() in (0, 2)
    space.pinned[:] = True
    assert MOVES["sequence"](rng, s, space) is None     # pinned units never change


def test_the_sequence_move_is_drawn_only_where_a_unit_may_have_it():
    assert "sequence" in MCMCSearch(llama(), TWO, seed=0)._move_names
    assert "sequence" not in MCMCSearch(chain_graph(3, batch=8), TWO, seed=0)._move_names
