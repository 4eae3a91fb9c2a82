"""The normalizations the sequence-parallel rule names (strategy layer, by kind) are the ones
export runs replicated and as ``SequenceParallel`` (graph layer, by class): the two layers may
not import each other, so the one vocabulary is written twice and held equal here."""
from memflow.graph.slicing import NORMS
from memflow.strategy.sequence_parallel import NORM_KINDS


def test_norm_kinds_name_the_normalizations_export_runs_whole():
    assert NORM_KINDS == tuple(cls.__name__ for cls in NORMS)
