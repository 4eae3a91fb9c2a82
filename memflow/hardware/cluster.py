"""Cluster: the devices, hosts, switches and links a training step runs on.

Four validated DataFrames (columns in ``docs/data-model.md``, "Cluster"), route lookups
between devices (GPU → host → switch → host → GPU across nodes), JSON in and out, and ways to
derive a variant (a memory cap, another efficiency). Presets and the parametric builder live in
:mod:`memflow.hardware.presets`.

>>> c = Cluster.preset("2x4xA100-80GB")
>>> len(c), c.devices.loc["gpu5", "node"]
(8, np.int64(1))
>>> [c.links.loc[i, "kind"] for i in c.route("gpu0", "gpu5")]
['pcie4', 'ib-hdr', 'ib-hdr', 'pcie4']
>>> round(c.bandwidth("gpu0", "gpu1") / 1e9)   # NVLink, 300 GB/s per direction at 0.8
240
>>> c.with_memory("40GiB").devices["memory_bytes"].iloc[0] == 40 * 2**30
np.True_
"""
from __future__ import annotations

import html
import os
from functools import cached_property
from typing import Any, Iterable, Mapping

import numpy as np
import pandas as pd

from .._jsonio import read_json, write_json
from .._units import format_bytes, parse_bytes
from ..errors import ClusterError
from .arrays import ClusterArrays
from .tables import validate

__all__ = ["Cluster"]

FORMAT = "memflow.cluster/1"
_FIGURES = {  # the ``figures`` column's values, as the report says them
    "datasheet": "datasheet (peaks from the vendor, efficiencies from the sourced table)",
    "measured": "measured on this machine (Cluster.local micro-benchmark)",
    "calibrated": "calibrated (efficiencies fitted to measured op times)",
}

class Cluster:
    """Devices (GPUs), hosts (one per node, for offloading), switches and directed links.

    Build one with :meth:`preset`, :meth:`build` or :meth:`from_dict`; the tables are
    validated and normalized on construction (see :func:`memflow.hardware.tables.validate`).
    """

    def __init__(self, devices: pd.DataFrame, hosts: pd.DataFrame, links: pd.DataFrame,
                 switches: pd.DataFrame | None = None, *, name: str = "custom") -> None:
        self.devices, self.hosts, self.links, self.switches = validate(devices, hosts, links,
                                                                       switches)
        self.name = str(name)

    # -- construction -----------------------------------------------------------------------
    # Cluster.preset, Cluster.presets and Cluster.build are memflow.hardware.presets' functions,
    # attached there: they build clusters, so they sit above this module, not beside it.
    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> "Cluster":
        """A cluster from ``{"devices": [...], "hosts": [...], "links": [...]}`` records.

        Each list holds one mapping per row (``device``/``host``/``switch`` give the names);
        ``switches`` and ``name`` are optional. Missing optional columns take defaults.

        >>> c = Cluster.from_dict({
        ...     "devices": [{"device": "gpu0", "node": 0, "memory_bytes": 8e9, "host": "cpu"}],
        ...     "hosts": [{"host": "cpu", "node": 0, "memory_bytes": 64e9}],
        ...     "links": [{"src": "gpu0", "dst": "cpu", "kind": "pcie3"},
        ...               {"src": "cpu", "dst": "gpu0", "kind": "pcie3"}]})
        >>> c.route("gpu0", "cpu"), round(c.bandwidth("gpu0", "cpu") / 1e9, 1)
        ([0], 12.6)
        """
        if not isinstance(doc, Mapping):
            raise ClusterError(f"a cluster description must be a mapping, got {type(doc).__name__}")
        missing = [k for k in ("devices", "hosts", "links") if k not in doc]
        if missing:
            raise ClusterError(f"cluster description lacks {missing}; it needs 'devices', "
                               "'hosts' and 'links' (lists of records), 'switches' optional")

        def table(key: str, index: str) -> pd.DataFrame:
            rows = doc.get(key) or []
            if not isinstance(rows, list) or not all(isinstance(r, Mapping) for r in rows):
                raise ClusterError(f"cluster description: {key!r} must be a list of records")
            df = pd.DataFrame(list(rows))
            if index != "link" and len(df) and index not in df.columns:
                raise ClusterError(f"cluster description: every record of {key!r} needs "
                                   f"its name under {index!r}")
            return df.set_index(index) if index in df.columns else df

        switches = table("switches", "switch") if doc.get("switches") else None
        return cls(table("devices", "device"), table("hosts", "host"), table("links", "link"),
                   switches, name=doc.get("name", "custom"))

    def to_dict(self) -> dict[str, Any]:
        """Plain records (JSON-ready); ``Cluster.from_dict(c.to_dict())`` equals ``c``."""
        def records(df: pd.DataFrame) -> list[dict[str, Any]]:
            return df.reset_index().to_dict(orient="records")

        return {"format": FORMAT, "name": self.name, "devices": records(self.devices),
                "hosts": records(self.hosts), "switches": records(self.switches),
                "links": self.links.to_dict(orient="records")}

    def to_json(self, path: str | os.PathLike) -> None:
        """Write the cluster to a JSON file (atomically)."""
        write_json(path, self.to_dict())

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> "Cluster":
        """Read a cluster written by :meth:`to_json`; errors name the file."""
        doc = read_json(path, kind="memflow.cluster/")
        if doc["format"] != FORMAT:
            raise ClusterError(f"{path}: format {doc['format']!r} is not {FORMAT!r}")
        try:
            return cls.from_dict(doc)
        except ClusterError as exc:
            raise ClusterError(f"{path}: {exc}") from None

    # -- derived clusters -------------------------------------------------------------------
    def replace(self, *, name: str | None = None, devices: Iterable[str] | None = None,
                **columns: Any) -> "Cluster":
        """A copy with device columns set: a scalar for every device (or those in ``devices``),
        or a mapping/Series by device name.

        >>> c = Cluster.preset("4xV100-16GB").replace(compute_efficiency=0.5, devices=["gpu0"])
        >>> c.devices["compute_efficiency"].tolist()
        [0.5, 0.6, 0.6, 0.6]
        """
        table = self.devices.copy()
        rows = table.index if devices is None else pd.Index(list(devices))
        unknown = rows.difference(table.index)
        if len(unknown):
            raise ClusterError(f"unknown device {unknown[0]!r}; devices are "
                               f"{list(table.index[:8])}")
        for col, value in columns.items():
            if col not in table.columns or col == "host":
                raise ClusterError(f"cannot set device column {col!r}; settable: "
                                   f"{[c for c in table.columns if c != 'host']}")
            if isinstance(value, (Mapping, pd.Series)):
                value = pd.Series(value, dtype=object)
                bad = value.index.difference(table.index)
                if len(bad):
                    raise ClusterError(f"{col}: unknown device {bad[0]!r}")
                table[col] = table[col].astype(object)
                table.loc[value.index, col] = value.to_numpy()
            else:
                table[col] = table[col].astype(object)
                table.loc[rows, col] = value
        return Cluster(table, self.hosts, self.links, self.switches,
                       name=name or f"{self.name}*")

    def with_memory(self, memory: float | str | Mapping[str, float | str],
                    devices: Iterable[str] | None = None) -> "Cluster":
        """A copy whose devices (all, or those named) have ``memory`` bytes: a cap to plan for
        a smaller budget, or a per-device mapping. Strings such as ``"8GB"`` are accepted."""
        if isinstance(memory, Mapping):
            value: Any = {k: parse_bytes(v) for k, v in memory.items()}
        else:
            value = parse_bytes(memory)
        return self.replace(memory_bytes=value, devices=devices,
                            name=f"{self.name} (memory set)")

    # -- routes -----------------------------------------------------------------------------
    @cached_property
    def arrays(self) -> ClusterArrays:
        """Numpy views for inner loops (built once): see :class:`ClusterArrays`."""
        return ClusterArrays.from_tables(self.devices, self.hosts, self.links, self.switches)

    def _vertex(self, name: str) -> int:
        pos = self.arrays.routing.vertex.get_indexer([name])[0]
        if pos < 0:
            raise ClusterError(f"{name!r} is not a device, host or switch of cluster "
                               f"{self.name!r}; devices are {list(self.devices.index[:8])}")
        return int(pos)

    def route(self, a: str, b: str) -> list[int]:
        """Rows of :attr:`links` a transfer from ``a`` to ``b`` crosses, in order.

        Endpoints are device, host or switch names; [] when ``a == b``.
        """
        return self.arrays.routing.route(self._vertex(a), self._vertex(b))

    def bandwidth(self, a: str, b: str) -> float:
        """Achieved bytes/s from ``a`` to ``b``: the slowest link's bandwidth · efficiency."""
        path = self.route(a, b)
        return float(self.arrays.link_rate[path].min()) if path else float("inf")

    def latency(self, a: str, b: str) -> float:
        """Seconds of latency from ``a`` to ``b``: the sum over the route's links."""
        return float(self.arrays.link_latency[self.route(a, b)].sum())

    def ring_bandwidth(self, devices: Iterable[str]) -> float:
        """Achieved bandwidth of a ring over ``devices`` (in the order given): the slowest
        link, divided by how many ring hops share it. inf for fewer than two devices."""
        return self.arrays.routing.ring(self._positions(devices))[0]

    def ring_latency(self, devices: Iterable[str]) -> float:
        """Latency of one ring step over ``devices``: the slowest hop's route latency."""
        return self.arrays.routing.ring(self._positions(devices))[1]

    def _positions(self, devices: Iterable[str]) -> np.ndarray:
        names = pd.Index(list(devices))
        pos = self.devices.index.get_indexer(names)
        if (pos < 0).any():
            raise ClusterError(f"unknown device {names[pos < 0][0]!r}; devices are "
                               f"{list(self.devices.index[:8])}")
        return pos

    @property
    def unified(self) -> pd.Series:
        """True for devices whose memory is the host's (edge boards: offloading frees nothing)."""
        uni = self.links.loc[self.links["kind"] == "unified", "src"]
        return pd.Series(self.devices.index.isin(uni), index=self.devices.index, name="unified")

    def figures_note(self, devices: Iterable[str] | None = None) -> str:
        """Where the time figures of ``devices`` (default: all) come from, in one line: the
        ``figures`` column, per device model.

        >>> Cluster.preset("2xV100-16GB").figures_note()
        'V100-16GB: datasheet (peaks from the vendor, efficiencies from the sourced table)'
        """
        table = self.devices if devices is None else self.devices.loc[list(devices)]
        parts = []
        for (model, source), _ in table.groupby(["model", "figures"], sort=False):
            parts.append(f"{model}: {_FIGURES.get(source, source)}")
        return "; ".join(parts)

    # -- display ----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.devices)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Cluster):
            return NotImplemented
        return all(a.equals(b) for a, b in zip(self._tables(), other._tables()))

    __hash__ = None  # type: ignore[assignment]  # mutable tables: not hashable

    def _tables(self) -> tuple[pd.DataFrame, ...]:
        return self.devices, self.hosts, self.links, self.switches

    def _overview(self) -> pd.DataFrame:
        d = self.devices
        per = d.groupby("model", sort=False).agg(devices=("node", "size"),
                                                 nodes=("node", "nunique"),
                                                 memory=("memory_bytes", "first"))
        per["memory"] = per["memory"].map(format_bytes)
        return per

    def summary(self) -> str:
        """A few lines: devices per model, nodes, memory, link kinds."""
        kinds = self.links["kind"].value_counts()
        lines = [f"Cluster {self.name!r}: {len(self.devices)} devices on "
                 f"{self.devices['node'].nunique()} node(s), "
                 f"{format_bytes(self.devices['memory_bytes'].sum())} device memory, "
                 f"{format_bytes(self.hosts['memory_bytes'].sum())} host memory"]
        for row in self._overview().itertuples():
            lines.append(f"  {row.devices} x {row.Index} ({row.memory}) "
                         f"on {row.nodes} node(s)")
        lines.append("  links: " + ", ".join(f"{n} {k}" for k, n in kinds.items()))
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<Cluster {self.name!r}: {len(self.devices)} devices, {len(self.links)} links>"

    def _repr_html_(self) -> str:
        head = html.escape(self.summary().splitlines()[0])
        kinds = (self.links.groupby("kind")
                 .agg(links=("src", "size"), bandwidth_GBps=("bandwidth", "max"),
                      efficiency=("efficiency", "first"), latency_us=("latency", "first")))
        kinds["bandwidth_GBps"] /= 1e9
        kinds["latency_us"] *= 1e6
        return (f"<div><b>{head}</b>{self._overview().to_html()}"
                f"<b>links</b>{kinds.to_html(float_format=lambda v: f'{v:.3g}')}</div>")
