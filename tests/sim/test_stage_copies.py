"""A weight or buffer read in two pipeline stages is held by both
(torch.distributed.pipelining)."""
import numpy as np
import pandas as pd

import memflow
from memflow.graph import OpGraph
from memflow.strategy import Strategy


def _graph(tied: bool) -> OpGraph:
    units = pd.DataFrame({"fwd_flops": [1e6] * 3, "bwd_flops": [2e6] * 3,
                          "param_bytes": [1000, 400, 0], "trainable_bytes": [1000, 400, 0],
                          "buffer_bytes": [0, 64, 0]},
                         index=["embed", "block", "head"])
    tensors = pd.DataFrame({"bytes": [64, 64, 64], "producer": ["<input>", "embed", "block"],
                            "consumers": [["embed"], ["block"], ["head"]],
                            "savers": [[], ["block"], ["head"]],
                            "requires_grad": [False, True, True]})
    w = pd.DataFrame({"name": ["embed.weight", "block.weight", "block.mask"],
                      "names": [["embed.weight", "head.weight"], ["block.weight"], ["block.mask"]],
                      "bytes": [1000, 400, 64], "numel": [250, 100, 16],
                      "owner": ["embed", "block", "block"], "is_buffer": [False, False, True],
                      "readers": [["embed", "head"] if tied else ["embed"], ["block"],
                                  ["block", "head"] if tied else ["block"]],
                      "trainable": [True, True, False]})
    return OpGraph(units, tensors, {"batch_size": 4}, parameters=w)


def _simulate(g: OpGraph, stages: int):
    two = memflow.Cluster.preset("2xV100-16GB")
    s = Strategy(g.names, devices=[("gpu0",), ("gpu0",), (f"gpu{stages - 1}",)],
                 stage=[0, 0, stages - 1], microbatches=2, schedule="gpipe")
    return memflow.simulate(g, s, two, optimizer="adam")


def test_a_tied_weight_is_charged_on_every_stage_that_reads_it():
    ms = _simulate(_graph(tied=True), 2).model_states
    assert ms.loc["gpu0"].tolist() == [1464, 1400, 2800]
    assert ms.loc["gpu1"].tolist() == [1064, 1000, 2000]       # the head's copies
    assert _simulate(_graph(tied=False), 2).model_states.loc["gpu1"].tolist() == [0, 0, 0]
    one = _simulate(_graph(tied=True), 1).model_states          # one stage: held once
    assert one.loc["gpu0"].tolist() == [1464, 1400, 2800]


def test_the_copies_gradients_are_summed_between_the_stages():
    assert (_simulate(_graph(tied=True), 2).iteration_time
            > _simulate(_graph(tied=False), 2).iteration_time)


def test_each_stage_makes_the_gradient_of_its_copy():
    from memflow.memory.arrays import graph_arrays
    from memflow.memory.states import stage_arrays
    ga = stage_arrays(graph_arrays(_graph(tied=True)), np.array([0, 0, 1]))
    # embed.weight, block.weight, block.mask, then the head's copies of embed.weight and the mask
    assert ga.param_owner.tolist() == [0, 1, 1, 2, 2]
    assert ga.param_grad_unit.tolist() == [0, 1, 1, 2, 2]
    assert ga.param_readers_idx.tolist() == [0, 1, 1, 2, 2]
    assert ga.param_grad_bytes.tolist() == [1000, 400, 0, 1000, 0]
