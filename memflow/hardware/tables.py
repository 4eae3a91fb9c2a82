"""The four tables of a cluster, their columns, and the checks that make them consistent.

Every check raises :class:`~memflow.errors.ClusterError` naming the row and field at fault and
what would be valid. The checks are vectorized so a 1,024-GPU cluster validates in
milliseconds.

>>> import pandas as pd
>>> dev = pd.DataFrame({"node": [0], "model": ["x"], "memory_bytes": [-1], "host": ["host0"]},
...                    index=pd.Index(["gpu0"], name="device"))
>>> validate(dev, pd.DataFrame({"node": [0], "memory_bytes": [0]},
...          index=pd.Index(["host0"], name="host")), pd.DataFrame(columns=["src", "dst", "kind"]))
Traceback (most recent call last):
...
memflow.errors.ClusterError: device 'gpu0': memory_bytes is negative (-1.0); ...
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..errors import ClusterError
from .catalogue import LINK_KINDS, lookup_gpu

__all__ = ["DEVICE_COLUMNS", "HOST_COLUMNS", "LINK_COLUMNS", "SWITCH_COLUMNS", "validate"]

# column -> default when absent (None: required). Float columns are rates, sizes or times.
DEVICE_COLUMNS: dict[str, Any] = {
    "node": None,
    "model": "custom",
    "memory_bytes": None,
    "peak_flops_fp32": 1e13,
    "peak_flops_fp16": np.nan,       # NaN: no fast FP16, the FP32 rate is used
    # whether bfloat16 runs at peak_flops_fp16 (False: at peak_flops_fp32, as on GPUs before
    # compute capability 8.0); missing: the catalogue's answer for the model, else True
    "bf16": np.nan,
    "mem_bandwidth": 1e12,
    "compute_efficiency": 0.7,
    "memory_efficiency": 0.85,
    "launch_overhead": 5e-6,
    "host": None,
    # where the rate and efficiency figures come from: "datasheet" (the catalogue and its
    # efficiency table), "measured" (Cluster.local) or "calibrated" (hardware.calibrate)
    "figures": "datasheet",
}
HOST_COLUMNS: dict[str, Any] = {"node": None, "memory_bytes": None}
LINK_COLUMNS: dict[str, Any] = {
    "src": None, "dst": None, "kind": None,
    "bandwidth": np.nan,             # NaN: the kind's default (catalogue.LINK_KINDS)
    "efficiency": np.nan,
    "latency": np.nan,
}
SWITCH_COLUMNS: dict[str, Any] = {"node": -1, "kind": "network"}
SWITCH_KINDS = ("network", "nvswitch")

_DEVICE_FLOATS = ("memory_bytes", "peak_flops_fp32", "peak_flops_fp16", "mem_bandwidth",
                  "compute_efficiency", "memory_efficiency", "launch_overhead")
_POSITIVE = ("peak_flops_fp32", "peak_flops_fp16", "mem_bandwidth")
_FRACTIONS = ("compute_efficiency", "memory_efficiency")


def _frame(df: Any, what: str, index: str, columns: dict[str, Any]) -> pd.DataFrame:
    if not isinstance(df, pd.DataFrame):
        raise ClusterError(f"{what} must be a pandas DataFrame, got {type(df).__name__}")
    df = df.copy()
    if index in df.columns:
        df = df.set_index(index)
    df.index = df.index.astype(str)
    df.index.name = index
    if df.index.has_duplicates:
        dup = df.index[df.index.duplicated()].unique().tolist()
        raise ClusterError(f"{what}: {index} names must be unique; repeated: {dup[:5]}")
    for col, default in columns.items():
        if col not in df.columns:
            if default is None:
                raise ClusterError(f"{what} table lacks the required column {col!r}; "
                                   f"columns are {list(columns)}")
            df[col] = default
    extra = [c for c in df.columns if c not in columns]
    return df[list(columns) + extra]


def _numeric(df: pd.DataFrame, what: str, cols: tuple[str, ...]) -> None:
    for col in cols:
        values = pd.to_numeric(df[col], errors="coerce").astype(np.float64)
        bad = values.isna() & df[col].notna()
        if bad.any():
            name = df.index[bad.to_numpy()][0]
            raise ClusterError(f"{what} {name!r}: {col} must be a number, got {df.at[name, col]!r}")
        df[col] = values


def _first_bad(df: pd.DataFrame, mask: np.ndarray) -> str | None:
    idx = np.flatnonzero(mask)
    return None if idx.size == 0 else df.index[idx[0]]


def _check_devices(devices: pd.DataFrame, hosts: pd.DataFrame) -> pd.DataFrame:
    if isinstance(devices, pd.DataFrame) and len(devices) == 0:
        raise ClusterError("devices is empty: a cluster needs at least one device")
    devices = _frame(devices, "devices", "device", DEVICE_COLUMNS)
    _numeric(devices, "device", _DEVICE_FLOATS)
    devices["model"] = devices["model"].astype(str)
    devices["figures"] = devices["figures"].astype(str)
    for col in ("memory_bytes", "launch_overhead"):
        bad = _first_bad(devices, (devices[col] < 0).to_numpy())
        if bad is not None:
            raise ClusterError(f"device {bad!r}: {col} is negative ({devices.at[bad, col]}); "
                               "it must be >= 0")
    fp16 = devices["peak_flops_fp16"]
    devices["peak_flops_fp16"] = fp16.where(fp16.notna(), devices["peak_flops_fp32"])
    devices["bf16"] = _bf16_column(devices)
    for col in _POSITIVE:
        bad = _first_bad(devices, ~(devices[col] > 0).to_numpy())
        if bad is not None:
            raise ClusterError(f"device {bad!r}: {col} must be > 0, got {devices.at[bad, col]}")
    for col in _FRACTIONS:
        v = devices[col].to_numpy()
        bad = _first_bad(devices, ~((v > 0) & (v <= 1)))
        if bad is not None:
            raise ClusterError(f"device {bad!r}: {col} must be in (0, 1], got {v[devices.index.get_loc(bad)]}")
    host = devices["host"]
    missing = host.isna() | ~host.astype(str).isin(hosts.index)
    bad = _first_bad(devices, missing.to_numpy())
    if bad is not None:
        raise ClusterError(f"device {bad!r}: host {devices.at[bad, 'host']!r} is not a host of "
                           f"this cluster; every device needs one of {list(hosts.index[:8])}")
    devices["host"] = host.astype(str)
    devices["node"] = _int_column(devices, "device", "node")
    return devices


def _bf16_column(devices: pd.DataFrame) -> pd.Series:
    """The ``bf16`` column as booleans: a missing value takes the catalogue's answer for the
    device's model, and True for a model the catalogue lacks (a GPU declared by hand is taken
    to run bfloat16 at the 16-bit peak it was given, as every GPU since Ampere does)."""
    col = devices["bf16"]
    given = col.notna().to_numpy()
    ok = np.array([v is None or isinstance(v, (bool, np.bool_)) or v != v for v in col])
    bad = _first_bad(devices, ~ok)
    if bad is not None:
        value = devices.at[bad, "bf16"]
        raise ClusterError(f"device {bad!r}: bf16 must be true or false (whether it computes "
                           f"bfloat16 at its peak_flops_fp16), got "
                           f"{getattr(value, 'item', lambda: value)()!r}")
    models = devices["model"]
    default = models.map({m: getattr(lookup_gpu(m), "bf16", True) for m in models.unique()})
    return pd.Series(np.where(given, col.to_numpy(object), default.to_numpy(object)),
                     index=devices.index).astype(bool)


def _int_column(df: pd.DataFrame, what: str, col: str) -> pd.Series:
    values = pd.to_numeric(df[col], errors="coerce")
    bad = _first_bad(df, (values.isna() | (values != values.round())).to_numpy())
    if bad is not None:
        raise ClusterError(f"{what} {bad!r}: {col} must be an integer, got {df.at[bad, col]!r}")
    return values.astype(np.int64)


def _check_hosts(hosts: pd.DataFrame) -> pd.DataFrame:
    hosts = _frame(hosts, "hosts", "host", HOST_COLUMNS)
    _numeric(hosts, "host", ("memory_bytes",))
    bad = _first_bad(hosts, ~(hosts["memory_bytes"] >= 0).to_numpy())
    if bad is not None:
        raise ClusterError(f"host {bad!r}: memory_bytes must be >= 0, "
                           f"got {hosts.at[bad, 'memory_bytes']}")
    hosts["node"] = _int_column(hosts, "host", "node")
    return hosts


def _check_switches(switches: pd.DataFrame | None, taken: pd.Index) -> pd.DataFrame:
    if switches is None:
        switches = pd.DataFrame(columns=list(SWITCH_COLUMNS), index=pd.Index([], name="switch"))
    switches = _frame(switches, "switches", "switch", SWITCH_COLUMNS)
    clash = switches.index.intersection(taken)
    if len(clash):
        raise ClusterError(f"switch {clash[0]!r} has the name of a device or host; "
                           "names must be unique across devices, hosts and switches")
    kinds = switches["kind"].astype(str)
    bad = _first_bad(switches, ~kinds.isin(SWITCH_KINDS).to_numpy())
    if bad is not None:
        raise ClusterError(f"switch {bad!r}: unknown kind {kinds[bad]!r}; valid: {SWITCH_KINDS}")
    switches["kind"] = kinds
    switches["node"] = _int_column(switches, "switch", "node") if len(switches) else \
        switches["node"].astype(np.int64)
    return switches


def _check_links(links: pd.DataFrame, endpoints: pd.Index, devices: pd.DataFrame) -> pd.DataFrame:
    if not isinstance(links, pd.DataFrame):
        raise ClusterError(f"links must be a pandas DataFrame, got {type(links).__name__}")
    links = links.reset_index(drop=True)
    links.index.name = "link"
    links = _frame(links, "links", "link", LINK_COLUMNS)
    links.index = pd.RangeIndex(len(links), name="link")
    for col in ("src", "dst", "kind"):
        links[col] = links[col].astype(str)
    kinds = links["kind"]
    bad = _first_bad(links, ~kinds.isin(list(LINK_KINDS)).to_numpy())
    if bad is not None:
        raise ClusterError(f"link {bad} ({links.at[int(bad), 'src']} -> "
                           f"{links.at[int(bad), 'dst']}): unknown kind {kinds[int(bad)]!r}; "
                           f"valid: {sorted(LINK_KINDS)}")
    for end in ("src", "dst"):
        bad = _first_bad(links, ~links[end].isin(endpoints).to_numpy())
        if bad is not None:
            raise ClusterError(
                f"link {bad}: {end} {links.at[int(bad), end]!r} is not a device, host or switch "
                f"of this cluster; devices are {_preview(devices.index)}")
    loop = _first_bad(links, (links["src"] == links["dst"]).to_numpy())
    if loop is not None:
        raise ClusterError(f"link {loop}: src and dst are both {links.at[int(loop), 'src']!r}")
    _numeric(links, "link", ("bandwidth", "efficiency", "latency"))
    for col in ("bandwidth", "efficiency", "latency"):
        default = kinds.map({k: getattr(v, col) for k, v in LINK_KINDS.items()})
        links[col] = links[col].where(links[col].notna(), default)
    bad = _first_bad(links, ~(links["bandwidth"] > 0).to_numpy())
    if bad is not None:
        raise ClusterError(f"link {bad} ({links.at[int(bad), 'kind']}): bandwidth must be > 0 "
                           "(nvlink, unified, memcpy and loopback links have no default: give it)")
    eff = links["efficiency"].to_numpy()
    bad = _first_bad(links, ~((eff > 0) & (eff <= 1)))
    if bad is not None:
        raise ClusterError(f"link {bad}: efficiency must be in (0, 1], got {eff[int(bad)]}")
    bad = _first_bad(links, ~(links["latency"] >= 0).to_numpy())
    if bad is not None:
        raise ClusterError(f"link {bad}: latency must be >= 0")
    return links


def _preview(names: pd.Index) -> str:
    shown = ", ".join(names[:4])
    return f"{shown}, … ({len(names)} in all)" if len(names) > 4 else shown


def validate(devices: pd.DataFrame, hosts: pd.DataFrame, links: pd.DataFrame,
             switches: pd.DataFrame | None = None
             ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Check and normalize the four tables; return copies with every column filled.

    Missing optional columns get their defaults, NaN link figures get their kind's defaults
    (``catalogue.LINK_KINDS``), NaN ``peak_flops_fp16`` becomes the FP32 rate and a missing
    ``bf16`` the catalogue's answer for the device's model (True for a model it lacks).
    """
    hosts = _check_hosts(hosts)
    devices = _check_devices(devices, hosts)
    clash = devices.index.intersection(hosts.index)
    if len(clash):
        raise ClusterError(f"{clash[0]!r} names both a device and a host; names must be unique")
    switches = _check_switches(switches, devices.index.append(hosts.index))
    endpoints = devices.index.append(hosts.index).append(switches.index)
    links = _check_links(links, endpoints, devices)
    return devices, hosts, links, switches
