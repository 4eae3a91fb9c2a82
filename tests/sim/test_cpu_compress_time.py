"""A CPU's compress policy time: the compressor's measured rate on each kind of map a unit
packs, plus its fixed cost per call, one call per saved map (memflow.sim.cpu_time)."""
import numpy as np
import pytest

from memflow.graph.mapkind import MAP_KINDS
from memflow.hardware.local import EXAMPLE_FIGURES, local_cluster
from memflow.sim import Simulator
from memflow.sim.cpu_time import compressed_maps, cpu_compressor_cost
from memflow.strategy import Strategy

from .graphs import chain


def kinds_chain():
    """chain(): u1 saves a rectified map (200 B, from u0) and a signed one (20 B); u2 an
    integer map (its 300 B input) and a probability one (30 B)."""
    g = chain()
    t = g.tensors
    t["map_kind"] = ["signed", "signed", "rectified", "signed", "integer", "probability",
                     "signed"]
    return g


def test_compressed_maps_counts_the_floating_storages_each_unit_saves_first():
    g = kinds_chain()
    calls, by_kind = compressed_maps(g)
    assert calls.tolist() == [2, 2, 1]          # u2's integer map is kept as it is
    col = {k: MAP_KINDS.index(k) for k in MAP_KINDS}
    assert by_kind[1, col["rectified"]] == 200 and by_kind[1, col["signed"]] == 20
    assert by_kind[2].sum() == 30 and by_kind[2, col["probability"]] == 30
    assert by_kind[:, col["integer"]].sum() == 0


def test_a_cpu_unit_pays_each_kinds_rate_and_a_fixed_cost_per_call():
    g = kinds_chain()
    cpu = local_cluster(EXAMPLE_FIGURES, 1, threads=1, clock="cpu")
    sim = Simulator(g, cpu)
    rates = {"rectified": 1e3, "signed": 4e3}          # bytes/s: slow on purpose
    sim._compress = (lambda eb, dtype, kind: 4.0,
                     lambda mem, decompress=False, error_bound=0.01, kind="rectified":
                     rates[kind] * (2 if decompress else 1),
                     lambda bits, decompress=False: 0.0,
                     lambda decompress=False, error_bound=0.01, kind="rectified":
                     0.5 if kind == "rectified" else 0.1)
    tl = sim.result(Strategy.single_device(g).with_policy({"u1": "compress:0.01"})).timeline
    comp = tl[tl["kind"] == "compress"].iloc[0]
    decomp = tl[tl["kind"] == "decompress"].iloc[0]
    nbytes = comp["bytes"]
    assert nbytes == 220
    # bytes by kind (200 rectified, 20 signed), 2 calls split as the bytes are
    share = np.array([200, 20]) / 220
    per_call = 2 * (share[0] * 0.5 + share[1] * 0.1)
    seconds = nbytes * (share[0] / 1e3 + share[1] / 4e3) + per_call
    assert comp["end"] - comp["start"] == pytest.approx(seconds)
    back = nbytes * (share[0] / 2e3 + share[1] / 8e3) + per_call
    assert decomp["end"] - decomp["start"] == pytest.approx(back)


def test_the_fixed_cost_is_charged_on_a_cpu_only():
    # a GPU's quantizer pays its launches; per_call is 0 there (compress_model's GPU path)
    from memflow.sim.cpu_time import compress_model
    assert compress_model()[3](decompress=False, error_bound=1e-2) == 0.0


@pytest.mark.slow
def test_the_measured_compressor_has_a_fixed_cost_and_a_rate():
    # a line through a 16 KiB and a 1 MiB map: a 16 KiB call costs more per byte
    rate, per_call = cpu_compressor_cost(1e-2, False, "cpu", "signed")
    assert rate > 0 and per_call >= 0
    small = 16 * 2**10
    assert (per_call + small / rate) / small >= 1 / rate
