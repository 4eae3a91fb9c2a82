"""The bf16 capability of devices: catalogue entries, defaults, validation, JSON round trip."""
import pytest

from memflow.errors import ClusterError
from memflow.hardware import Cluster
from memflow.hardware.catalogue import EDGE_BOARDS, GPUS


def test_catalogue_says_which_gpus_have_bf16_units():
    """Compute capability 8.0 and later (Ampere, Hopper, Jetson Orin) compute bfloat16 in
    hardware; Kepler to Volta (K80, Titan X, P100, V100, Jetson Nano/TX2/Xavier) do not."""
    have = {name for name, gpu in {**GPUS, **EDGE_BOARDS}.items() if gpu.bf16}
    assert have == {"A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB",
                    "jetson-orin-nano-8GB"}
    assert Cluster.preset("8xV100-16GB").devices["bf16"].eq(False).all()
    assert Cluster.preset("2x4xH100-80GB").devices["bf16"].eq(True).all()


def test_bf16_peak_is_the_fp32_peak_without_bf16_units():
    v100, a100 = Cluster.preset("1xV100-16GB").arrays, Cluster.preset("1xA100-80GB").arrays
    assert v100.peak_flops("bfloat16")[0] == 15.7e12 and v100.peak_flops("float16")[0] == 125e12
    assert a100.peak_flops("torch.bfloat16")[0] == a100.peak_flops("float16")[0] == 312e12


def custom(**device):
    return {"devices": [{"device": "gpu0", "node": 0, "memory_bytes": 8e9, "host": "h",
                         "peak_flops_fp16": 1e14, **device}],
            "hosts": [{"host": "h", "node": 0, "memory_bytes": 64e9}],
            "links": [{"src": "gpu0", "dst": "h", "kind": "pcie4"},
                      {"src": "h", "dst": "gpu0", "kind": "pcie4"}]}


def test_default_is_the_catalogues_answer_for_the_model_else_true():
    assert Cluster.from_dict(custom()).devices.at["gpu0", "bf16"]                  # unknown model
    assert not Cluster.from_dict(custom(model="V100-32GB")).devices.at["gpu0", "bf16"]
    assert Cluster.from_dict(custom(model="V100-32GB", bf16=True)).devices.at["gpu0", "bf16"]
    assert not Cluster.from_dict(custom(bf16=None, model="P100")).devices.at["gpu0", "bf16"]


@pytest.mark.parametrize("value", ["yes", 1, 0.5])
def test_a_non_boolean_names_the_device_and_the_field(value):
    with pytest.raises(ClusterError, match=r"device 'gpu0': bf16 must be true or false .* "
                                           + repr(value).replace(".", r"\.")):
        Cluster.from_dict(custom(bf16=value))


def test_json_round_trip_keeps_it(tmp_path):
    c = Cluster.preset("2xA100-80GB").replace(bf16=False, devices=["gpu1"])
    path = tmp_path / "c.json"
    c.to_json(path)
    back = Cluster.from_json(path)
    assert back == c and back.devices["bf16"].tolist() == [True, False]
    assert back.devices["bf16"].dtype == bool


def test_a_local_cpu_runs_bf16_at_its_fp32_rate():
    """PyTorch runs bf16 natively on a CPU; the CPU's one measured rate serves every dtype."""
    from memflow.hardware.local import EXAMPLE_FIGURES, local_cluster
    a = local_cluster(EXAMPLE_FIGURES, 1).arrays
    assert a.bf16.tolist() == [True]
    assert a.peak_flops("bfloat16")[0] == a.peak_flops("float32")[0]
