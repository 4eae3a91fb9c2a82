"""OpGraph: a model as a chain of units with the memory and compute numbers of one training step.

The graph is three tables (see ``docs/data-model.md`` for every column):

* ``units`` — one row per unit, indexed by unit name, in forward execution order;
* ``tensors`` — one row per activation storage that outlives the op that made it: forward
  outputs consumed by a later unit (or returned by the model) and tensors autograd saves for
  backward. Parameters and buffers are not activations and never appear here;
* ``parameters`` — one row per parameter or buffer storage (tied weights once), with the unit
  that owns it and the units that read it (:mod:`~memflow.graph.parameters`).

``input_bytes``, ``output_bytes`` and ``saved_bytes`` of a unit are *derived* from ``tensors``,
and ``params``, ``param_bytes``, ``trainable_bytes`` and ``buffer_bytes`` from ``parameters``
(never given twice), so they always agree with the tensor-level truth that the memory ledger
uses. ``edges`` (``src``, ``dst``, ``bytes``) is derived the same way.
"""
from __future__ import annotations

import html
from pathlib import Path
from typing import Any, Mapping

import networkx as nx
import numpy as np
import pandas as pd

from .._jsonio import read_json, write_json
from .._units import format_bytes
from ..errors import GraphError
from .opcost import KERNEL_CLASSES
from .parameters import (UNIT_PARAMETER_COLUMNS, as_names, check_agreement, check_parameters,
                         default_parameters, framed, unit_sums)

__all__ = ["OpGraph", "INPUT", "UNIT_COLUMNS", "TENSOR_COLUMNS", "PASSES"]

INPUT = "<input>"
"""Producer name of the model's inputs in ``graph.tensors``."""

PASSES = ("bf16", "amp")
"""The second passes a graph may hold, as attributes and file keys: the step as a bf16
precision runs it, and as ``amp`` (float16 autocast) runs it (:func:`memflow.from_torch`)."""
FORMAT = "memflow.graph/2"     # /2 added the parameters table; /1 files still load

# Columns a unit table must or may carry, with the default used when it is absent.
# None means required.
UNIT_COLUMNS: dict[str, Any] = {
    "module": "",            # module path the unit's ops belong to ("<root>" for the model itself)
    "kind": "Unit",          # module class name
    "role": "module",        # "module": a whole module call; "glue": a module's own code between child units
    "call": 1,               # k-th span of the same module in execution order (1-based)
    "block": "",             # the block (graph.units.enclosing_blocks) the unit lies in; "": none
    "fwd_flops": None,
    "bwd_flops": None,
    "fwd_bytes_moved": 0,
    "bwd_bytes_moved": 0,
    "fwd_ops": 0,
    "bwd_ops": 0,
    "fwd_tmp_bytes": 0,
    "bwd_tmp_bytes": 0,
    "dtype": "float32",
    "max_parameter_degree": 1,
    "max_attribute_degree": 1,
    "shard_axis": -1,        # weight axis a parameter split slices (graph.slicing); -1: none
    "tensor_degree": 0,      # largest Megatron split of a container (graph.slicing); 0: none
    # selective recomputation (memflow.graph.selective): the forward cost of the unit's
    # expensive ops, which it does not re-run, and the bytes of their outputs used only inside
    # the unit, which it keeps
    "expensive_fwd_flops": 0.0,
    "expensive_fwd_bytes_moved": 0,
    "expensive_fwd_ops": 0,
    "cached_bytes": 0,
    # bwd_tmp_bytes were what the unit saved compressed, decompressed node by node by the
    # unpack hooks; -1: not recorded (a graph saved before the column): the memory model
    # decompresses all the unit saves before its backward
    "unpack_tmp_bytes": -1,
    "unpack_done_bytes": 0,      # … what the nodes run before its peak unpacked (packs gone)
    "selective_replays": True,   # no expensive output it keeps is written in place (export runs it)
    # its forward's matrix products and convolutions: [class, m, n, k, count] each
    # (memflow.graph.opcost.kernel_shape); empty in a graph saved before the column
    "kernels": (),
}
DERIVED_UNIT_COLUMNS = ("input_bytes", "output_bytes", "saved_bytes")

TENSOR_COLUMNS: dict[str, Any] = {
    "bytes": None,
    "producer": None,         # unit name, or "<input>"
    "consumers": None,        # list of unit names reading it in forward, in execution order
    "savers": (),             # list of unit names whose ops saved it for backward, in execution order
    "is_output": False,       # returned by the model (kept until backward: meta keep_output)
    "requires_grad": True,    # a gradient flows back into it
    "per_sample": True,       # its size scales with the batch
    "dtype": "float32",
    "shape": (),
    "expensive": False,       # made by an expensive op: selective recomputation keeps it
    "map_kind": "signed",     # its values' kind, for compression ratios (graph.mapkind)
}

_INT_COLUMNS = ("fwd_bytes_moved", "bwd_bytes_moved", "fwd_ops", "bwd_ops", "fwd_tmp_bytes",
                "bwd_tmp_bytes", "max_parameter_degree", "max_attribute_degree", "call",
                "expensive_fwd_bytes_moved", "expensive_fwd_ops", "cached_bytes",
                "unpack_done_bytes", "tensor_degree")
_FLOAT_COLUMNS = ("fwd_flops", "bwd_flops", "expensive_fwd_flops")


def _kernels(unit: str, value: Any) -> list[list]:
    """A unit's ``kernels`` cell as ``[[class, m, n, k, count], …]``, checked."""
    try:
        rows = [[str(c), *(int(x) for x in dims)] for c, *dims in value]
    except (TypeError, ValueError):
        rows = None
    if rows is None or any(len(r) != 5 or r[0] not in KERNEL_CLASSES or min(r[1:]) < 1
                           for r in rows):
        raise GraphError(f"unit {unit!r}: kernels must be a list of [class, m, n, k, count] "
                         f"with class one of {list(KERNEL_CLASSES)} and sizes >= 1, got "
                         f"{value!r}")
    return rows


class OpGraph:
    """A captured model: units in execution order and the activation tensors between them.

    Build one with :func:`memflow.from_torch` (or :func:`memflow.zoo.graph`); build a synthetic
    one for experiments and tests directly from two DataFrames, and optionally a third,
    ``parameters`` (without it, each unit owns its ``param_bytes`` and ``buffer_bytes``).

    Examples
    --------
    A three-unit chain where each unit saves its input:

    >>> import pandas as pd
    >>> from memflow.graph import OpGraph
    >>> units = pd.DataFrame({"fwd_flops": [1e9, 2e9, 1e9], "bwd_flops": [2e9, 4e9, 2e9]},
    ...                      index=["a", "b", "c"])
    >>> tensors = pd.DataFrame({
    ...     "bytes": [100, 200, 300, 400],
    ...     "producer": ["<input>", "a", "b", "c"],
    ...     "consumers": [["a"], ["b"], ["c"], []],
    ...     "savers": [["a"], ["b"], ["c"], []],
    ...     "is_output": [False, False, False, True],
    ... })
    >>> g = OpGraph(units, tensors)
    >>> g.units[["input_bytes", "output_bytes", "saved_bytes"]]
          input_bytes  output_bytes  saved_bytes
    unit
    a             100           200          100
    b             200           300          200
    c             300           400          300
    >>> g.edges
      src dst  bytes
    0   a   b    200
    1   b   c    300

    A weight shared by ``a`` and ``c`` is one row of ``parameters``, owned by ``a``:

    >>> w = pd.DataFrame({"name": ["a.weight"], "names": [["a.weight", "c.weight"]],
    ...                   "bytes": [64], "numel": [16], "owner": ["a"], "readers": [["a", "c"]]})
    >>> g = OpGraph(units, tensors, parameters=w)
    >>> g.units["param_bytes"].tolist()
    [64, 0, 0]
    """

    def __init__(self, units: pd.DataFrame, tensors: pd.DataFrame,
                 meta: Mapping[str, Any] | None = None, *,
                 parameters: pd.DataFrame | None = None, bf16: "OpGraph | None" = None,
                 amp: "OpGraph | None" = None):
        self.meta: dict[str, Any] = dict(meta or {})
        # the same step as a bf16 precision runs it (memflow.graph.compute), and as amp runs
        # it (float16 autocast): their own tensors and byte columns, captured by second
        # passes; None: not captured (memflow.sim.precision then halves the fp32 activations)
        self.bf16, self.amp = bf16, amp
        self.units = self._check_units(units)
        self.parameters = self._check_parameters(parameters)
        self.tensors = self._check_tensors(tensors)
        for key, other in self.passes().items():
            if list(other.units.index) != list(self.units.index):
                raise GraphError(f"{key}: its units must be the graph's, in the same order")
        self._derive()
        self._edges: pd.DataFrame | None = None

    # ------------------------------------------------------------------ checking
    @staticmethod
    def _check_units(units: pd.DataFrame) -> pd.DataFrame:
        if not isinstance(units, pd.DataFrame):
            raise GraphError(f"units must be a pandas DataFrame, got {type(units).__name__}")
        if len(units) == 0:
            raise GraphError("units is empty: a graph needs at least one unit")
        units = units.copy()
        units.index = units.index.map(str)
        units.index.name = "unit"
        dup = units.index[units.index.duplicated()].unique().tolist()
        if dup:
            raise GraphError(f"unit names must be unique; repeated: {dup[:5]}")
        if INPUT in units.index:
            raise GraphError(f"{INPUT!r} is reserved for the model's inputs and cannot name a unit")
        for col, default in UNIT_COLUMNS.items():
            if col not in units.columns:
                if default is None:
                    raise GraphError(f"units table lacks the required column {col!r}")
                units[col] = (units.index if col == "module" else
                              [[] for _ in units.index] if default == () else default)
        for col in _INT_COLUMNS:
            units[col] = pd.to_numeric(units[col], errors="raise").astype(np.int64)
        for col in _FLOAT_COLUMNS:
            units[col] = pd.to_numeric(units[col], errors="raise").astype(np.float64)
        for col in ("shard_axis", "unpack_tmp_bytes"):        # -1: none, not recorded
            units[col] = pd.to_numeric(units[col], errors="raise").astype(np.int64)
        units["selective_replays"] = units["selective_replays"].astype(bool)
        units["kernels"] = [_kernels(u, v) for u, v in zip(units.index, units["kernels"])]
        for col in _INT_COLUMNS + _FLOAT_COLUMNS:
            bad = units.index[units[col] < 0].tolist()
            if bad:
                raise GraphError(f"unit {bad[0]!r}: {col} is negative ({units.at[bad[0], col]}); "
                                 "it must be >= 0")
        for col in ("max_parameter_degree", "max_attribute_degree", "call"):
            bad = units.index[units[col] < 1].tolist()
            if bad:
                raise GraphError(f"unit {bad[0]!r}: {col} must be >= 1")
        units = units.drop(columns=[c for c in DERIVED_UNIT_COLUMNS if c in units.columns])
        return units

    def _check_parameters(self, parameters: pd.DataFrame | None) -> pd.DataFrame:
        # The unit columns of parameters are derived from the table; as given they only seed
        # the default table or are checked against the given one.
        given = self.units[[c for c in UNIT_PARAMETER_COLUMNS if c in self.units.columns]]
        self.units = self.units.drop(columns=given.columns)
        if parameters is None:
            parameters = default_parameters(given)
        table = check_parameters(parameters, self.names)
        sums = unit_sums(table, self.names)
        check_agreement(given, sums)
        at = self.units.columns.get_loc("call") + 1
        for i, col in enumerate(UNIT_PARAMETER_COLUMNS):
            self.units.insert(at + i, col, sums[col].to_numpy())
        return table

    def _check_tensors(self, tensors: pd.DataFrame) -> pd.DataFrame:
        tensors = framed(tensors, "tensors", TENSOR_COLUMNS, "tensor")
        tensors["bytes"] = pd.to_numeric(tensors["bytes"], errors="raise").astype(np.int64)
        tensors["producer"] = tensors["producer"].astype(str)
        tensors["consumers"] = tensors["consumers"].map(as_names)
        tensors["savers"] = tensors["savers"].map(as_names)
        tensors["shape"] = tensors["shape"].map(lambda s: [int(x) for x in s])
        for col in ("is_output", "requires_grad", "per_sample"):
            tensors[col] = tensors[col].astype(bool)
        neg = tensors.index[tensors["bytes"] < 0].tolist()
        if neg:
            raise GraphError(f"tensor {neg[0]}: bytes is negative")
        order = {name: i for i, name in enumerate(self.units.index)}
        order[INPUT] = -1
        for t, row in zip(tensors.index, tensors.itertuples(index=False)):
            if row.producer not in order:
                raise GraphError(f"tensor {t}: producer {row.producer!r} is not a unit of this "
                                 f"graph (nor {INPUT!r})")
            for field in ("consumers", "savers"):
                for name in getattr(row, field):
                    if name not in order or name == INPUT:
                        raise GraphError(f"tensor {t}: {field[:-1]} {name!r} is not a unit of "
                                         "this graph")
                    if order[name] < order[row.producer]:
                        raise GraphError(
                            f"tensor {t}: {field[:-1]} {name!r} runs before its producer "
                            f"{row.producer!r}; units must be in execution order")
        return tensors

    def _derive(self) -> None:
        order = {name: i for i, name in enumerate(self.units.index)}
        t = self.tensors

        def pick(names: list[str], which) -> str | None:
            return which(names, key=order.__getitem__) if names else None

        t["first_saver"] = pd.Series([pick(s, min) for s in t["savers"]], index=t.index,
                                     dtype=object)
        t["last_consumer"] = pd.Series([pick(s, max) for s in t["consumers"]], index=t.index,
                                       dtype=object)
        inp = pd.Series(0, index=self.units.index, dtype=np.int64)
        out = inp.copy()
        saved = inp.copy()
        for row in t.itertuples(index=False):
            readers = set(row.consumers)
            for name in readers - {row.producer}:
                inp[name] += row.bytes
            if row.producer != INPUT and (row.is_output or readers - {row.producer}):
                out[row.producer] += row.bytes
            if isinstance(row.first_saver, str):
                saved[row.first_saver] += row.bytes
        self.units["input_bytes"] = inp
        self.units["output_bytes"] = out
        self.units["saved_bytes"] = saved

    # ------------------------------------------------------------------ views
    @property
    def names(self) -> list[str]:
        """Unit names in execution order."""
        return self.units.index.tolist()

    def __len__(self) -> int:
        return len(self.units)

    def __iter__(self):
        return iter(self.units.index)

    def __contains__(self, name: object) -> bool:
        return name in self.units.index

    @property
    def edges(self) -> pd.DataFrame:
        """Data flow between units: ``src``, ``dst``, ``bytes`` (model inputs excluded)."""
        if self._edges is None:
            rows: dict[tuple[str, str], int] = {}
            for row in self.tensors.itertuples(index=False):
                if row.producer == INPUT:
                    continue
                for dst in dict.fromkeys(row.consumers):
                    if dst != row.producer:
                        rows[(row.producer, dst)] = rows.get((row.producer, dst), 0) + row.bytes
            order = {name: i for i, name in enumerate(self.units.index)}
            items = sorted(rows.items(), key=lambda kv: (order[kv[0][0]], order[kv[0][1]]))
            self._edges = pd.DataFrame(
                {"src": [k[0] for k, _ in items], "dst": [k[1] for k, _ in items],
                 "bytes": np.array([v for _, v in items], dtype=np.int64)})
        return self._edges

    def to_networkx(self) -> nx.DiGraph:
        """The units as a networkx ``DiGraph``: unit columns as node attributes, ``bytes`` on edges.

        >>> import memflow
        >>> g = memflow.zoo.graph("chain", n=4)      # doctest: +SKIP
        >>> nx.is_directed_acyclic_graph(g.to_networkx())  # doctest: +SKIP
        True
        """
        dg = nx.DiGraph(**{k: v for k, v in self.meta.items() if isinstance(v, (str, int, float))})
        for name, row in self.units.iterrows():
            dg.add_node(name, **row.to_dict())
        for row in self.edges.itertuples(index=False):
            dg.add_edge(row.src, row.dst, bytes=int(row.bytes))
        return dg

    @property
    def totals(self) -> pd.Series:
        """Whole-model sums of the unit columns that add up (params, bytes, FLOPs)."""
        cols = ["params", "param_bytes", "trainable_bytes", "buffer_bytes", "input_bytes",
                "output_bytes", "saved_bytes", "fwd_flops", "bwd_flops", "fwd_ops", "bwd_ops"]
        s = self.units[cols].sum()
        s["units"] = len(self.units)
        return s

    def summary(self) -> pd.DataFrame:
        """One row per unit kind with the sums that matter for memory and time, plus a total row."""
        cols = ["params", "param_bytes", "saved_bytes", "output_bytes", "fwd_flops", "bwd_flops"]
        by = self.units.groupby("kind", sort=False)[cols].sum()
        by.insert(0, "units", self.units.groupby("kind", sort=False).size())
        by = by.sort_values("saved_bytes", ascending=False)
        total = by.sum().to_frame("total").T
        out = pd.concat([by, total])
        out.index.name = "kind"
        return out

    def __repr__(self) -> str:
        tot = self.totals
        name = self.meta.get("model", "model")
        return (f"<OpGraph {name}: {len(self)} units, {int(tot['params']):,} params, "
                f"saved {format_bytes(tot['saved_bytes'])}, "
                f"{tot['fwd_flops'] / 1e9:,.2f} GFLOP forward>")

    def _repr_html_(self) -> str:
        cols = ["kind", "params", "output_bytes", "saved_bytes", "fwd_flops", "fwd_tmp_bytes"]
        head = self.units[cols].head(12)
        more = len(self.units) - len(head)
        styled = head.style.format({c: format_bytes for c in cols if c.endswith("bytes")}
                                   | {"fwd_flops": lambda v: f"{v / 1e9:,.3f} G",
                                      "params": "{:,}"})
        tail = f"<p>… and {more} more units (see <code>.units</code>)</p>" if more > 0 else ""
        return (f"<div><b>{html.escape(repr(self))}</b>"
                f"{self.summary().to_html(float_format=lambda v: f'{v:,.4g}')}"
                f"{styled.to_html()}{tail}</div>")

    # ------------------------------------------------------------------ files
    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready description from which :meth:`from_dict` rebuilds the same graph."""
        derived = list(DERIVED_UNIT_COLUMNS) + list(UNIT_PARAMETER_COLUMNS)
        units = self.units.drop(columns=derived).reset_index()
        tensors = self.tensors.drop(columns=["first_saver", "last_consumer"])
        doc = {"format": FORMAT, "meta": self.meta,
               "units": units.to_dict(orient="list"),
               "tensors": tensors.to_dict(orient="list"),
               "parameters": self.parameters.to_dict(orient="list")}
        for key, other in self.passes().items():    # optional keys: files without them load
            doc[key] = {k: v for k, v in other.to_dict().items() if k != "meta"}
        return doc

    def passes(self) -> dict[str, "OpGraph"]:
        """The second passes captured (:data:`PASSES` keys: ``bf16``, ``amp``), by key."""
        return {key: getattr(self, key) for key in PASSES if getattr(self, key) is not None}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> "OpGraph":
        """The graph :meth:`to_dict` described (a ``memflow.graph/1`` document, written before
        the parameters table existed, gets the default table from its unit columns)."""
        if not isinstance(doc, Mapping) or not str(doc.get("format", "")).startswith("memflow.graph"):
            raise GraphError("not a memflow graph document (its 'format' is not 'memflow.graph/…')")
        units = pd.DataFrame(doc["units"]).set_index("unit")
        parameters = doc.get("parameters")
        passes = {key: cls.from_dict({**doc[key], "meta": doc.get("meta")})
                  for key in PASSES if doc.get(key) is not None}
        return cls(units, pd.DataFrame(doc["tensors"]), doc.get("meta"),
                   parameters=None if parameters is None else pd.DataFrame(parameters), **passes)

    def save(self, path: str | Path) -> Path:
        """Write the graph as JSON (atomically)."""
        return write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> "OpGraph":
        """Read a graph written by :meth:`save`."""
        doc = read_json(path, kind="memflow.graph")
        try:
            return cls.from_dict(doc)
        except (KeyError, TypeError) as exc:
            raise GraphError(f"{path}: graph document is incomplete ({exc})") from None
