"""memflow.estimate on hand-checked chains (see tests/sim/graphs.py for the chain's tensors)."""
import pytest

from memflow.errors import MemflowError
from memflow.sim import estimate
from memflow.strategy import Strategy

from .graphs import chain


def test_keep_all_peak_is_hand_checked():
    g = chain()
    df = estimate(g, "cpu")
    # end of u0's backward: weights 1200 and the three parameter gradients 1200 (each appears
    # at the end of its unit's backward); what the backwards consumed went at their starts.
    # The end of u1's backward holds less: weights 1200, grads of u2 and u1 800, t0 and u0's
    # internal tensor 110, the gradient of u0's output 200 = 2310
    assert df.loc["total", "at_peak"] == 2400
    assert df.attrs["peak_task"] == "backward u0"
    assert df.loc["activations", "max"] == 710          # everything saved, end of forward
    assert df.loc["weights", "at_peak"] == 1200


def test_adam_peaks_in_the_optimizer_step():
    g = chain()
    cpu = estimate(g, "cpu", optimizer="adam")
    # weights + grads + 2 states + per-tensor sqrt temporaries (2 × a parameter while the
    # previous one's denom is held: 3 × 400 here)
    assert cpu.loc["total", "at_peak"] == 1200 + 1200 + 2400 + 1200
    assert cpu.attrs["phase"] == "optimizer"
    cuda = estimate(g, "cuda", optimizer="adam")        # foreach: one temporary per parameter
    assert cuda.loc["total", "at_peak"] == 1200 + 1200 + 2400 + 1200
    assert estimate(g, "cpu", optimizer="momentum").loc["optimizer", "at_peak"] == 1200


def test_recompute_and_offload_lower_activations_by_what_they_drop():
    g = chain()
    keep = estimate(g, "cpu").loc["activations", "max"]
    rec = estimate(g, "cpu", strategy=Strategy.single_device(g).with_policy(recompute=["u1"]))
    assert keep - rec.loc["activations", "max"] == 20     # u1's internal tensor; its input is held


def test_capacity_from_a_preset_and_bad_input():
    g = chain()
    df = estimate(g, "1xV100-16GB")
    assert df.attrs["fits"] is True and df.attrs["capacity"] == 16 * 2 ** 30
    with pytest.raises(MemflowError, match="optimizer"):
        estimate(g, "cpu", optimizer="lamb")
    with pytest.raises(MemflowError, match="one device"):
        estimate(g, "cpu", strategy=Strategy.data_parallel(g, 2))


def test_tied_weight_gradient_starts_at_its_last_reader():
    import pandas as pd
    from memflow.graph import OpGraph
    # a's backward makes a contribution to the existing gradient: capture counts it in a's
    # backward temporaries (1000 here), the model charges nothing else for it
    units = pd.DataFrame({"fwd_flops": [1.0] * 3, "bwd_flops": [2.0] * 3,
                          "bwd_tmp_bytes": [1000.0, 0.0, 0.0]}, index=["a", "b", "c"])
    tensors = pd.DataFrame({"bytes": [10, 20, 30], "producer": ["<input>", "a", "b"],
                            "consumers": [["a"], ["b"], ["c"]], "savers": [[], [], []],
                            "requires_grad": [False, False, False]})
    w = pd.DataFrame({"name": ["a.weight"], "names": [["a.weight", "c.weight"]],
                      "bytes": [1000], "numel": [250], "owner": ["a"], "readers": [["a", "c"]],
                      "trainable": [True]})
    df = estimate(OpGraph(units, tensors, parameters=w), "cpu")
    # the weight once; its gradient from the end of c's backward on; a's contribution
    assert df.loc["weights", "at_peak"] == 1000
    assert df.loc["total", "at_peak"] == 1000 + 1000 + 1000
    assert df.attrs["peak_task"] == "backward a"


def test_printed_in_units_with_plain_numbers_kept():
    g = chain()
    df = estimate(g, "V100-16GB")
    text = repr(df)
    assert text.splitlines()[0].startswith("peak 2.34 KiB during backward u0 on gpu0 of 16.0 GiB")
    assert text.splitlines()[0].endswith(": fits")
    assert "2.34 KiB" in df.to_string() and "e+" not in text
    assert "2.34 KiB" in df._repr_html_() and "fits" in df._repr_html_()
    assert df.loc["total", "at_peak"] == 2400 and df["max"].dtype.kind == "f"
    assert df.to_csv().splitlines()[-1] == "total,2400.0,2400.0"   # files keep the numbers


def test_on_a_cpu_offloaded_storages_stay_in_its_memory():
    # u1's backward needs 2000 B: the peak is there, with u0's input and internal tensor (110)
    # saved for u0's backward. A GPU has them on the host then (vDNN prefetches u0's after
    # u1's backward); a CPU's host is its own memory, so they count there, as images
    # standing in for the storages, and backward reads them in place (no restored copy)
    g = chain(tmp=(0, 2000, 0))
    every = Strategy.single_device(g).with_policy(offload=["u0", "u1", "u2"])
    keep = estimate(g, "cpu")
    cpu, cuda = estimate(g, "cpu", strategy=every), estimate(g, "cuda", strategy=every)
    assert keep.attrs["peak_task"] == cpu.attrs["peak_task"] == "backward u1"
    assert cpu.loc["total", "at_peak"] == keep.loc["total", "at_peak"] == 4310
    assert cpu.loc["activations", "at_peak"] == 110
    assert cuda.loc["total", "at_peak"] == 4310 - 110
    # forward: a storage goes when its readers are done and its image comes after its
    # saver's forward, so they are never there twice in a chain: at most what keep holds
    assert cpu.loc["activations", "max"] == keep.loc["activations", "max"] == 710
