"""The CUDA caching allocator's rounding and segments, against examples worked by hand from
CUDACachingAllocator.cpp (kMinBlockSize 512, kSmallSize 1 MiB, kSmallBuffer 2 MiB,
kLargeBuffer 20 MiB, kMinLargeAlloc 10 MiB, kRoundLarge 2 MiB)."""
import numpy as np
import pandas as pd
import pytest

from memflow.errors import MemflowError
from memflow.graph import OpGraph
from memflow.memory.allocator import (CUBLAS_WORKSPACE, MIB, STEP_WORKSPACES, CachingAllocator,
                                      block_of, charged, replay, round_size, segment_size)
from memflow.sim.estimate import estimate


@pytest.mark.parametrize("nbytes, block", [(0, 512), (1, 512), (511, 512), (512, 512),
                                           (513, 1024), (4 * 1000, 4096),
                                           (1_000_000, 1_000_448), (MIB + 1, MIB + 512)])
def test_requests_round_up_to_512_byte_blocks(nbytes, block):
    assert round_size(nbytes) == block


@pytest.mark.parametrize("nbytes, segment", [(512, 2 * MIB), (MIB, 2 * MIB),
                                             (MIB + 512, 20 * MIB), (10 * MIB - 512, 20 * MIB),
                                             (10 * MIB, 10 * MIB), (10 * MIB + 512, 12 * MIB),
                                             (33 * MIB, 34 * MIB)])
def test_segments_are_2_mib_small_20_mib_large_or_rounded_to_2_mib(nbytes, segment):
    assert segment_size(nbytes) == segment


def test_small_blocks_split_from_one_2_mib_segment_and_merge_back():
    a = CachingAllocator()
    x, y = a.malloc(1000), a.malloc(3000)          # 1024 + 3072 B, one small segment
    assert (a.allocated, a.reserved, a.segments) == (4096, 2 * MIB, 1)
    a.free(x)
    a.free(y)                                      # merged into the whole segment again
    big = a.malloc(MIB)                            # 1 MiB is still small: it fits there
    assert (a.allocated, a.reserved, a.segments) == (MIB, 2 * MIB, 1)
    a.free(big)
    assert a.allocated == 0 and a.peak_allocated == MIB and a.peak_reserved == 2 * MIB


def test_large_blocks_split_only_above_1_mib_of_rest():
    a = CachingAllocator()
    a.malloc(5 * MIB)                              # 20 MiB segment: 15 MiB rest is split off
    assert (a.allocated, a.reserved) == (5 * MIB, 20 * MIB)
    a.malloc(14 * MIB)                             # from the 15 MiB rest: 1 MiB is not > 1 MiB
    assert a.allocated == 20 * MIB and a.reserved == 20 * MIB    # handed out whole
    a.malloc(12 * MIB)                             # >= 10 MiB: its own 12 MiB segment
    assert (a.reserved, a.segments) == (32 * MIB, 2)


def test_best_fit_reuses_the_smallest_free_block():
    # x, y (3 MiB each) from one 20 MiB segment; x freed; z (2 MiB) takes x's block whole
    a = replay([("x", 3 * MIB), ("y", 3 * MIB), ("x", -3 * MIB), ("z", 2 * MIB)])
    assert (a.allocated, a.peak_allocated, a.reserved, a.segments) == \
        (6 * MIB, 6 * MIB, 20 * MIB, 1)
    assert replay([("e", 0.0), ("e", -0.0)]).segments == 0     # empty tensors take no block
    # a small request never comes from the large pool: a new 2 MiB segment
    a.malloc(100)
    assert a.reserved == 22 * MIB


def test_charged_bytes_per_tensor_and_its_option():
    cuda = block_of("cuda")
    assert [charged(x, cuda) for x in (0.0, 10.0, 512.0, 600.0)] == [0.0, 512.0, 512.0, 1024.0]
    assert charged(10.5, block_of(None)) == 10.5
    with pytest.raises(ValueError, match="allocator must be one of"):
        block_of("hip")


def test_estimate_charges_blocks_and_estimates_reserved():
    # two units: a (input 100 B, out 200 B) and b (out 300 B), 400 B of weights each
    g = OpGraph(pd.DataFrame({"fwd_flops": [1.0, 1.0], "bwd_flops": [2.0, 2.0],
                              "param_bytes": [400, 400], "trainable_bytes": [400, 400]},
                             index=["a", "b"]),
                pd.DataFrame({"bytes": [100, 200, 300], "producer": ["<input>", "a", "b"],
                              "consumers": [["a"], ["b"], []], "savers": [["a"], ["b"], []],
                              "is_output": [False, False, True], "requires_grad": False}))
    plain = estimate(g, "cpu")
    cuda = estimate(g, "cpu", allocator="cuda")
    assert "reserved" not in plain.attrs
    # activations: every tensor becomes one 512-B block (3 x 512 instead of 600 B)
    assert cuda.loc["activations", "max"] == 3 * 512 > plain.loc["activations", "max"] == 600
    # cuBLAS's two workspaces (the loop's thread, autograd's) are held beside the tensors
    assert cuda.attrs["peak"] - STEP_WORKSPACES * CUBLAS_WORKSPACE > plain.attrs["peak"]
    assert cuda.loc["transient", "max"] >= STEP_WORKSPACES * CUBLAS_WORKSPACE
    # the tensors fit one small segment; each workspace takes a large one of its own size
    assert cuda.attrs["reserved"] == 2 * MIB + STEP_WORKSPACES * CUBLAS_WORKSPACE
    with pytest.raises(MemflowError, match="unknown allocator 'hip'"):
        estimate(g, "cpu", allocator="hip")
