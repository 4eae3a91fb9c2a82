"""A pipeline stage holds what it receives with a gradient to compute until its backward:
``PipelineStage`` computes its inputs' gradients, so autograd keeps the received leaf, saved
or not (a bf16 Llama's hidden state, which RMSNorm saves only as its fp32 copy; measured on
the exported script by ``benchmarks/bench_ranks.py``). A copy between devices of one process
(``x.to(device)``) is not held unless saved."""
import pandas as pd
import pytest

from memflow.export.validation import predicted_held
from memflow.graph import OpGraph
from memflow.strategy import Strategy


def _graph(requires_grad: bool) -> OpGraph:
    units = pd.DataFrame({"fwd_flops": [1.0] * 3, "bwd_flops": [2.0] * 3}, index=["a", "b", "c"])
    tensors = pd.DataFrame({
        "bytes": [8, 400, 200], "producer": ["<input>", "a", "b"],
        "consumers": [["a"], ["b"], ["c"]], "savers": [["a"], [], ["c"]],
        "requires_grad": [False, requires_grad, True], "per_sample": [False] * 3})
    return OpGraph(units, tensors, {"batch_size": 1})


@pytest.mark.parametrize("requires_grad, stage, held", [
    (True, [0, 1, 1], 600.0),        # received by stage 1: kept until its backward
    (False, [0, 1, 1], 200.0),       # no gradient to compute: freed after its last read
    (True, [0, 0, 0], 200.0),        # copied between devices of one process: freed too
])
def test_a_stage_keeps_what_it_receives_with_a_gradient(requires_grad, stage, held):
    g = _graph(requires_grad)
    s = Strategy(g.names, devices=[("gpu0",), ("gpu1",), ("gpu1",)], stage=stage,
                 microbatches=1)
    assert predicted_held(g, s)["gpu1"] == held
