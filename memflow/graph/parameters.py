"""The ``parameters`` table of an :class:`~memflow.graph.OpGraph`: weights and buffers, once each.

One row per parameter or buffer **storage** (tied weights once, under every name they go by):

* ``name`` — its first qualified name (``model.named_parameters()`` order, then buffers);
* ``names`` — every name it goes by (a tied embedding and head: both);
* ``bytes``, ``numel``, ``dtype``;
* ``trainable`` — it requires grad (gradient and optimizer state follow it); never a buffer;
* ``is_buffer`` — a module buffer (BatchNorm running statistics), not a parameter;
* ``owner`` — the unit that holds it: its first reader; for one no op reads, the first unit of
  its module or of the nearest enclosing module that ran;
* ``readers`` — the units whose forward ops read it, in execution order. The gradient of a
  trainable parameter is made by the backward of its *last* reader (the first to run in
  backward) and accumulated by the backward of every other reader;
* ``tensor_split`` — a parameter split of its owner shards it on the tensor-parallel path
  (:func:`memflow.graph.slicing.split_parameters`: a planned ``Linear``'s or ``Embedding``'s
  weight, a column-parallel bias); False: every rank of the group holds it whole (a
  normalization's weights, a row-parallel bias, a buffer — never split);
* ``row_split`` — the same where its owner, a ``Linear`` unit, runs row-parallel (the second
  of a Megatron pair of units, :func:`memflow.graph.slicing.unit_pairs`): its bias whole.

The units' ``params``, ``param_bytes``, ``trainable_bytes``, ``buffer_bytes`` and
``replicated_bytes`` are *derived*
from this table (:func:`unit_sums`), so the two can never disagree. A graph built without the
table gets one from those unit columns (:func:`default_parameters`).

>>> import pandas as pd
>>> units = pd.DataFrame({"params": [10, 0], "param_bytes": [40, 0], "trainable_bytes": [40, 0],
...                       "buffer_bytes": [0, 8]}, index=["fc", "bn"])
>>> table = default_parameters(units)
>>> table[["name", "bytes", "numel", "trainable", "is_buffer", "owner", "readers"]]
                name  bytes  numel  trainable  is_buffer owner readers
parameter
0          fc:params     40     10       True      False    fc    [fc]
1         bn:buffers      8      2      False       True    bn    [bn]
>>> unit_sums(check_parameters(table, ["fc", "bn"]), ["fc", "bn"]).loc["bn"].tolist()
[0, 0, 0, 8, 8]
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pandas as pd

from ..errors import GraphError

__all__ = ["PARAMETER_COLUMNS", "UNIT_PARAMETER_COLUMNS", "check_parameters",
           "default_parameters", "unit_sums", "check_agreement", "as_names", "framed"]

# Columns a parameters table must or may carry, with the default used when it is absent.
# None means required; an empty "names" means [name], an absent "readers" column [owner].
PARAMETER_COLUMNS: dict[str, Any] = {
    "name": None,
    "names": (),
    "bytes": None,
    "numel": None,
    "dtype": "float32",
    "trainable": True,
    "is_buffer": False,
    "owner": None,
    "readers": (),
    "tensor_split": True,
    "row_split": True,
}

UNIT_PARAMETER_COLUMNS = ("params", "param_bytes", "trainable_bytes", "buffer_bytes",
                          "replicated_bytes")
"""Unit columns derived from the parameters table."""
_SEEDS = UNIT_PARAMETER_COLUMNS[:4]     # the ones a graph built without the table gives

_ITEMSIZE_DTYPE = {8: "float64", 4: "float32", 2: "float16", 1: "int8"}


def as_names(value: Any) -> list[str]:
    """A list of unit or parameter names from a list, a tuple, one name, or None/NaN (empty)."""
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return []
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value]


def framed(table: pd.DataFrame, what: str, columns: dict[str, Any],
           index: str) -> pd.DataFrame:
    """A copy of ``table`` indexed ``0..n-1`` (named ``index``) with every one of ``columns``:
    an absent one gets its default (a tuple: a fresh list per row), or is an error if None."""
    if not isinstance(table, pd.DataFrame):
        raise GraphError(f"{what} must be a pandas DataFrame, got {type(table).__name__}")
    table = table.copy().reset_index(drop=True)
    table.index.name = index
    for col, default in columns.items():
        if col not in table.columns:
            if default is None:
                raise GraphError(f"{what} table lacks the required column {col!r}; "
                                 f"columns: {', '.join(columns)}")
            table[col] = [list(default) if isinstance(default, tuple) else default] * len(table)
    return table


def check_parameters(table: pd.DataFrame, units: Sequence[str]) -> pd.DataFrame:
    """``table`` validated against the unit names ``units`` (in execution order), normalised.

    Errors name the parameter and the field at fault:

    >>> t = pd.DataFrame({"name": ["w"], "bytes": [4], "numel": [1], "owner": ["nope"]})
    >>> check_parameters(t, ["a"])
    Traceback (most recent call last):
    ...
    memflow.errors.GraphError: parameter 'w': owner 'nope' is not a unit of this graph (units: a)
    """
    given_readers = isinstance(table, pd.DataFrame) and "readers" in table.columns
    table = framed(table, "parameters", PARAMETER_COLUMNS, "parameter")
    table["name"] = table["name"].astype(str)
    if "" in set(table["name"]):
        raise GraphError("parameters: a name is empty; every parameter needs its qualified name")
    table["names"] = [as_names(a) or [n] for n, a in zip(table["name"], table["names"])]
    table["owner"] = table["owner"].astype(str)
    table["readers"] = ([as_names(r) for r in table["readers"]] if given_readers
                        else [[o] for o in table["owner"]])
    for col in ("bytes", "numel"):
        table[col] = pd.to_numeric(table[col], errors="raise").astype(np.int64)
    for col in ("trainable", "is_buffer", "tensor_split", "row_split"):
        table[col] = table[col].astype(bool)
    for col in ("tensor_split", "row_split"):       # no style shards a buffer
        table[col] = table[col] & ~table["is_buffer"]
    table["dtype"] = table["dtype"].astype(str)
    order = {name: i for i, name in enumerate(units)}
    seen: dict[str, str] = {}
    for row in table.itertuples(index=False):
        _check_row(row, order, seen)
    return table[list(PARAMETER_COLUMNS)]


def _check_row(row: Any, order: dict[str, int], seen: dict[str, str]) -> None:
    where = f"parameter {row.name!r}"
    if row.name not in row.names:
        raise GraphError(f"{where}: names {row.names} must include its name")
    for alias in row.names:
        if alias in seen:
            raise GraphError(f"{where}: the name {alias!r} also names parameter "
                             f"{seen[alias]!r}; a storage is one row, under all its names")
        seen[alias] = row.name
    for col in ("bytes", "numel"):
        if getattr(row, col) < 0:
            raise GraphError(f"{where}: {col} is negative ({getattr(row, col)}); it must be >= 0")
    if row.is_buffer and row.trainable:
        raise GraphError(f"{where}: a buffer cannot be trainable; set trainable=False or "
                         "is_buffer=False")
    shown = ", ".join(list(order)[:5]) + (", …" if len(order) > 5 else "")
    for field, names in (("owner", [row.owner]), ("reader", row.readers)):
        for name in names:
            if name not in order:
                raise GraphError(f"{where}: {field} {name!r} is not a unit of this graph "
                                 f"(units: {shown})")
    pos = [order[r] for r in row.readers]
    if any(b <= a for a, b in zip(pos, pos[1:])):
        raise GraphError(f"{where}: readers {row.readers} must be distinct units in execution "
                         "order")
    if row.readers and row.owner != row.readers[0]:
        raise GraphError(f"{where}: owner {row.owner!r} is not its first reader "
                         f"{row.readers[0]!r}; a parameter belongs to the first unit that "
                         "reads it")


def unit_sums(table: pd.DataFrame, units: Sequence[str]) -> pd.DataFrame:
    """Per unit (in ``units`` order): ``params``, ``param_bytes``, ``trainable_bytes``,
    ``buffer_bytes`` of the rows it owns, and ``replicated_bytes``: those of its parameters and
    buffers a split leaves whole on every rank (``tensor_split`` False)."""
    param = ~table["is_buffer"]
    parts = pd.DataFrame({
        "owner": table["owner"],
        "params": table["numel"].where(param, 0),
        "param_bytes": table["bytes"].where(param, 0),
        "trainable_bytes": table["bytes"].where(param & table["trainable"], 0),
        "buffer_bytes": table["bytes"].where(~param, 0),
        "replicated_bytes": table["bytes"].where(~table["tensor_split"], 0),
    })
    sums = parts.groupby("owner").sum().reindex(list(units), fill_value=0)
    return sums[list(UNIT_PARAMETER_COLUMNS)].astype(np.int64)


def check_agreement(units: pd.DataFrame, sums: pd.DataFrame) -> None:
    """Raise if ``units`` carries a parameter column that disagrees with the table's ``sums``."""
    for col in UNIT_PARAMETER_COLUMNS:
        if col not in units.columns:
            continue
        given = pd.to_numeric(units[col], errors="raise").to_numpy(np.int64)
        bad = np.flatnonzero(given != sums[col].to_numpy(np.int64))
        if bad.size:
            name = units.index[bad[0]]
            raise GraphError(f"unit {name!r}: {col} is {given[bad[0]]} but the parameters table "
                             f"gives it {sums[col].iloc[bad[0]]}; drop the column (it is derived "
                             "from the table) or fix the table")


def default_parameters(units: pd.DataFrame) -> pd.DataFrame:
    """A parameters table from the unit columns of a graph built without one.

    Each unit with parameters gets a row ``unit:params`` for its trainable ones and
    ``unit:frozen`` for the rest (``params`` split in proportion to bytes), and a row
    ``unit:buffers`` for its buffers (assumed float32); it owns and reads them.
    """
    cols = {}
    for col in _SEEDS:
        v = pd.to_numeric(units[col], errors="raise") if col in units.columns else \
            pd.Series(0, index=units.index)
        bad = units.index[v < 0].tolist()
        if bad:
            raise GraphError(f"unit {bad[0]!r}: {col} is negative ({v[bad[0]]}); it must be >= 0")
        cols[col] = v.astype(np.int64)
    rows: list[dict[str, Any]] = []
    for name in units.index:
        numel, nbytes = int(cols["params"][name]), int(cols["param_bytes"][name])
        train, buffers = int(cols["trainable_bytes"][name]), int(cols["buffer_bytes"][name])
        if train > nbytes:
            raise GraphError(f"unit {name!r}: trainable_bytes ({train}) exceeds param_bytes "
                             f"({nbytes})")
        itemsize = nbytes // numel if numel else 4
        dtype = _ITEMSIZE_DTYPE.get(itemsize, "float32")
        n_train = round(numel * train / nbytes) if nbytes else numel
        for suffix, b, n, trainable, is_buffer, kind in (
                ("params", train, n_train, True, False, dtype),
                ("frozen", nbytes - train, numel - n_train, False, False, dtype),
                ("buffers", buffers, buffers // 4, False, True, "float32")):
            if b or n:
                rows.append({"name": f"{name}:{suffix}", "names": [f"{name}:{suffix}"],
                             "bytes": b, "numel": n, "dtype": kind, "trainable": trainable,
                             "is_buffer": is_buffer, "owner": name, "readers": [name],
                             "tensor_split": not is_buffer, "row_split": not is_buffer})
    table = pd.DataFrame(rows, columns=list(PARAMETER_COLUMNS))
    table.index.name = "parameter"
    return table
