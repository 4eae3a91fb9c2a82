"""From a :class:`~memflow.graph.recorder.Recorder` to the ``units``, ``tensors`` and
``parameters`` tables.

Rules that are heuristics, documented here because the simulator relies on them:

* **parameters** and buffers are one row each, tied weights once under all their names; each
  belongs to the first unit whose ops read it; one no op reads goes to the first unit of its
  module, or of the nearest enclosing module that ran, so that the units add up to the whole
  model (the units' parameter columns are sums over this table);
* a unit's **main output** is what its module returned (for a whole module call), else the
  largest storage it produces that a later unit reads or the model returns, else what its
  last op returned; its dtype is the unit's ``dtype``;
* **degrees** read the main output's shape: 4-D and larger outputs, and 3-D outputs of ``*1d``
  modules, are channels-first ``(N, C, H, …)``, giving parameter degree ``C`` and attribute
  degree ``H``; other 3-D outputs are ``(N, S, H)`` (sequence ``S``, hidden ``H``); 2-D ones
  ``(N, F)``. The parameter degree is ``C``/``H``/``F`` only for units that read parameters, or
  the number of heads for a module that has one (``num_heads``, ``n_head``,
  ``num_attention_heads``…); recurrent modules cannot split their sequence (attribute 1);
* a storage is **per-sample** when it descends from an input whose first dimension is the batch
  through ops that keep the batch, and one of its dimensions is a multiple of the batch
  (:mod:`~memflow.graph.batchdim`): a causal mask made once, a position embedding, a weight
  cast under autocast, batch norm's per-channel statistics or a scalar loss are not;
* a **second pass** (bf16, amp: :func:`pass_graph`) keeps the first pass's units — names, FLOPs, degrees
  and ``dtype``, the width model states are charged from — and takes from its own run the
  bytes each unit moves and holds for a while, its tensors, and its buffers' bytes.
"""
from __future__ import annotations

from typing import Any

import pandas as pd
from torch import nn

from .batchdim import carries_batch
from .opgraph import INPUT, OpGraph
from .recorder import Recorder
from .slicing import shard_axis, split_parameters, tensor_degree
from .spans import Span, Storage
from .units import ROOT

__all__ = ["unit_table", "tensor_table", "parameter_table", "pass_graph", "HEAD_ATTRIBUTES"]

HEAD_ATTRIBUTES = ("num_heads", "n_head", "n_heads", "num_attention_heads", "nhead", "heads")
_RECURRENT = ("LSTM", "GRU", "RNN")


def _kept(rec: Storage) -> bool:
    return rec.is_output or bool(rec.savers) or any(c != rec.producer for c in rec.consumers)


def _parent(path: str) -> str:
    return path.rsplit(".", 1)[0] if "." in path else ROOT


def parameter_table(recorder: Recorder, modules: dict[str, nn.Module]) -> pd.DataFrame:
    """The ``parameters`` table: one row per weight storage, with its owner and readers, and
    whether a parameter split of its owner shards it on the tensor-parallel path
    (``tensor_split``: :func:`~memflow.graph.slicing.split_parameters` of the owner's module,
    the rule export's tensor plan runs; ``row_split``: the same, a ``Linear`` owner run
    row-parallel)."""
    names = [s.name for s in recorder.spans]
    split: dict[tuple[int, bool], set[str]] = {}

    def sharded(owner: int, aliases: list[str], rowwise: bool = False) -> bool:
        span = recorder.spans[owner]
        module = modules.get(span.module) if span.role == "module" else None
        if module is None:
            return False
        if (owner, rowwise) not in split:
            prefix = "" if span.module == ROOT else span.module + "."
            split[owner, rowwise] = {prefix + n for n in split_parameters(module,
                                                                          rowwise=rowwise)}
        return any(n in split[owner, rowwise] for n in aliases)

    first_of: dict[str, int] = {}
    for span in recorder.spans:
        first_of.setdefault(span.module, span.index)
    rows = []
    for w in recorder.weights.values():
        if w.readers:
            owner = w.readers[0]
        else:
            path = w.module
            while path not in first_of and path != ROOT:
                path = _parent(path)
            owner = first_of.get(path, 0)
        rows.append({"name": w.names[0], "names": list(w.names), "bytes": w.nbytes,
                     "numel": w.numel, "dtype": w.dtype, "trainable": w.trainable,
                     "is_buffer": w.is_buffer, "owner": names[owner],
                     "readers": [names[r] for r in w.readers],
                     "tensor_split": not w.is_buffer and sharded(owner, w.names),
                     "row_split": not w.is_buffer and sharded(owner, w.names, True)})
    columns = ["name", "names", "bytes", "numel", "dtype", "trainable", "is_buffer", "owner",
               "readers", "tensor_split", "row_split"]
    return pd.DataFrame(rows, columns=columns)


def _degrees(span: Span, module: nn.Module | None, shape: tuple[int, ...]) -> tuple[int, int]:
    kind = span.kind
    if len(shape) >= 4 or (len(shape) == 3 and "1d" in kind):
        feature, attribute = shape[1], shape[2]
    elif len(shape) == 3:
        feature, attribute = shape[2], shape[1]
    elif len(shape) == 2:
        feature, attribute = shape[1], 1
    else:
        feature, attribute = 1, 1
    heads = next((getattr(module, a) for a in HEAD_ATTRIBUTES
                  if isinstance(getattr(module, a, None), int)), None)
    parameter = heads if heads else (feature if span.reads_params else 1)
    if any(r in kind for r in _RECURRENT):
        attribute = 1
    return max(int(parameter), 1), max(int(attribute), 1)


def unit_table(recorder: Recorder, modules: dict[str, nn.Module]) -> pd.DataFrame:
    """The ``units`` table (derived byte and parameter columns are added by :class:`OpGraph`)."""
    spans = recorder.spans
    main: dict[int, Storage] = {}
    cached = [0] * len(spans)      # expensive outputs used only inside their unit
    for rec in recorder.storages:
        if rec.expensive and rec.producer >= 0 and not _kept(rec):
            cached[rec.producer] += rec.nbytes
        if rec.producer >= 0 and (rec.is_output or any(c != rec.producer
                                                       for c in rec.consumers)):
            best = main.get(rec.producer)
            if best is None or rec.nbytes > best.nbytes:
                main[rec.producer] = rec
    rows = []
    for s in spans:
        out = main.get(s.index)
        dtype, shape = s.main_out or ((out.dtype, out.shape) if out is not None else
                                      (s.last_out or ("float32", ())))
        parameter, attribute = _degrees(s, modules.get(s.module), shape)
        rows.append({
            "unit": s.name, "module": s.module, "kind": s.kind, "role": s.role, "call": s.call,
            "fwd_flops": s.fwd_flops, "bwd_flops": s.bwd_flops,
            "fwd_bytes_moved": s.fwd_bytes, "bwd_bytes_moved": s.bwd_bytes,
            "fwd_ops": s.fwd_ops, "bwd_ops": s.bwd_ops,
            "fwd_tmp_bytes": s.fwd_tmp, "bwd_tmp_bytes": s.bwd_tmp, "dtype": dtype,
            "expensive_fwd_flops": s.expensive_flops,
            "expensive_fwd_bytes_moved": s.expensive_bytes,
            "expensive_fwd_ops": s.expensive_ops, "cached_bytes": cached[s.index],
            "kernels": [[*shape, count] for shape, count in s.kernels.items()],
            "unpack_tmp_bytes": s.unpack_tmp,
            "unpack_done_bytes": s.unpack_done,
            "selective_replays": s.selective_replays,
            "max_parameter_degree": parameter, "max_attribute_degree": attribute,
            "shard_axis": (shard_axis(modules.get(s.module))
                           if s.role == "module" and s.module != ROOT else -1),
            "tensor_degree": (tensor_degree(modules.get(s.module))
                              if s.role == "module" and s.module != ROOT else 0),
        })
    return pd.DataFrame(rows).set_index("unit")


def tensor_table(recorder: Recorder) -> pd.DataFrame:
    """The ``tensors`` table: storages read outside their producer, returned, or saved."""
    names = [s.name for s in recorder.spans]
    batch = recorder.batch_size
    rows: list[dict[str, Any]] = []
    for rec in recorder.storages:
        if not _kept(rec):
            continue
        rows.append({
            "bytes": rec.nbytes,
            "producer": INPUT if rec.producer < 0 else names[rec.producer],
            "consumers": [names[c] for c in rec.consumers],
            "savers": [names[c] for c in rec.savers],
            "is_output": rec.is_output, "requires_grad": rec.requires_grad,
            "per_sample": rec.tainted and carries_batch(rec.shape, batch),
            "dtype": rec.dtype, "shape": list(rec.shape), "expensive": rec.expensive,
            "map_kind": rec.kind,
        })
    columns = ["bytes", "producer", "consumers", "savers", "is_output", "requires_grad",
               "per_sample", "dtype", "shape", "expensive", "map_kind"]
    return pd.DataFrame(rows, columns=columns)


# what a unit moves and holds for a while: the second pass's own (the rest is the first pass's)
_PASS_COLUMNS = ("fwd_bytes_moved", "bwd_bytes_moved", "fwd_tmp_bytes", "bwd_tmp_bytes",
                 "expensive_fwd_bytes_moved", "cached_bytes", "unpack_tmp_bytes",
                 "unpack_done_bytes")


def pass_graph(units: pd.DataFrame, parameters: pd.DataFrame, recorder: Recorder,
               modules: dict[str, nn.Module], meta: dict[str, Any]) -> OpGraph:
    """``OpGraph.bf16`` or ``OpGraph.amp``: the step as a second pass ``recorder`` ran it, on
    the units of the first pass (``units``, ``parameters``: the same names in the same order);
    buffers at the bytes that pass gave them (batch norms' statistics in bf16), parameters at
    the first pass's (a precision's widths scale them, :mod:`memflow.memory.states`)."""
    own = unit_table(recorder, modules)
    u = units.copy()
    for column in _PASS_COLUMNS:
        u[column] = own[column].to_numpy()
    p = parameters.copy()
    cast = parameter_table(recorder, modules).set_index("name")
    buffers = p["is_buffer"].to_numpy(bool)
    for column in ("bytes", "dtype"):
        p.loc[buffers, column] = cast.loc[p.loc[buffers, "name"], column].to_numpy()
    return OpGraph(u, tensor_table(recorder), meta, parameters=p)
