"""Capture marks the units selective checkpointing cannot replay (an in-place write into an
expensive op's kept output); export refuses selective there and the search never proposes it."""
import pytest
import torch
from torch import nn

import memflow
from memflow.graph.capture import from_torch
from memflow.search.space import SearchSpace
from memflow.strategy import POLICIES, Strategy
from memflow.strategy.runnable import unrunnable


class Cell(nn.Module):
    """``gates = x W; gates += h U`` as an LSTM cell writes it: the matmul's output, which
    selective checkpointing keeps, is overwritten by ``add_``."""

    def __init__(self, inplace: bool = True):
        super().__init__()
        self.w, self.u, self.inplace = nn.Linear(8, 8), nn.Linear(8, 8, bias=False), inplace

    def forward(self, x):
        gates = self.w(x)
        h = self.u(x)
        gates = gates.add_(h) if self.inplace else gates + h
        return torch.tanh(gates)


class ReluAfterRead(nn.Module):
    """``relu_`` is idempotent, so it may write a kept output, unless an op read it first."""

    def __init__(self, read_first: bool):
        super().__init__()
        self.lin, self.read_first = nn.Linear(8, 8), read_first

    def forward(self, x):
        y = self.lin(x)
        skip = torch.sigmoid(y) if self.read_first else 0
        return torch.relu_(y) + skip


@pytest.mark.parametrize("module, replays", [
    (Cell(inplace=True), False), (Cell(inplace=False), True),
    (ReluAfterRead(read_first=False), True), (ReluAfterRead(read_first=True), False)])
def test_capture_marks_units_whose_kept_outputs_are_written(module, replays):
    g = from_torch(nn.Sequential(module), torch.randn(4, 8), units="blocks")
    assert bool(g.units.loc["0", "selective_replays"]) is replays


def test_export_and_search_leave_selective_out_where_it_does_not_replay():
    g = from_torch(nn.Sequential(Cell(inplace=True), Cell(inplace=False)), torch.randn(4, 8),
                   units="blocks")
    s = Strategy.single_device(g)
    assert unrunnable(s.with_policy(selective=["1"]), g) is None
    why = unrunnable(s.with_policy(selective=["0"]), g)
    assert why.startswith("unit '0' writes in place an output of an expensive op") and \
        "Valid: any other policy" in why
    selective = POLICIES.index("selective")
    space = SearchSpace(g, memflow.Cluster.preset("1xV100-16GB"),
                        policies=("keep", "recompute", "selective"))
    assert [selective in [c for c, _ in space.policy_choices(i)] for i in (0, 1)] == \
        [False, True]
    full = SearchSpace(g, memflow.Cluster.preset("1xV100-16GB"), runnable=False,
                       policies=("keep", "recompute", "selective"))
    assert selective in [c for c, _ in full.policy_choices(0)]    # FlexFlow's space: any


def test_a_saved_graph_keeps_the_mark(tmp_path):
    g = from_torch(nn.Sequential(Cell(inplace=True)), torch.randn(4, 8), units="blocks")
    loaded = memflow.OpGraph.load(g.save(tmp_path / "cell.json"))
    assert not loaded.units.loc["0", "selective_replays"]
