"""Which modules a parameter split can slice, and along which weight axis — declared once.

FlexFlow's parameter dimension of a ``Linear`` or a convolution is its output features (rows
of the weight); of an ``Embedding``, its embedding dimension (columns of the table). A module
of another kind, or a grouped convolution (whose output channels each read one group of the
input channels), has no such slice. Capture writes :func:`shard_axis` of each unit's module in
the ``shard_axis`` unit column, so the search knows what export can split
(:mod:`memflow.strategy.runnable`), and export slices by the same rule
(:mod:`memflow.export.sharding`).

A module with children (a transformer block) has no such slice, but Megatron's tensor
parallelism splits it when every ``Linear`` inside is a child named in a declared ``tp_plan``
(its children's styles, as Hugging Face's ``base_model_tp_plan``: column-parallel
``colwise-sharded`` or ``colwise-qkv``, then ``rowwise``) and nothing else inside holds a weight
but normalizations: :func:`tensor_degree` is the largest degree dividing every declared
module's head counts and sharded widths, which capture writes in the ``tensor_degree`` unit
column (0: no such container).

What a split runs on the tensor-parallel path is decided here too, for export and simulator
alike: :func:`megatron_plan` gives the ``parallelize_module`` style of every module a split
unit shards (each ``Linear`` and ``Embedding`` inside column-parallel, a Megatron pair inside
column- then row-parallel, a declared ``tp_plan``), and :func:`split_parameters` which of its
parameters those styles shard. Every other byte of the unit stays whole on every rank of the
group: a normalization's weights, a row-parallel ``Linear``'s bias (``RowwiseParallel`` keeps
it replicated), any other weight, every buffer. Capture writes the result per storage in the
parameters table's ``tensor_split`` column (and ``row_split``: the same for a ``Linear`` unit
run row-parallel, the second of a Megatron pair of units, :func:`unit_pairs`), which the
simulator charges by (``memflow.sim.replication``).

>>> from torch import nn
>>> shard_axis(nn.Linear(4, 2)), shard_axis(nn.Embedding(10, 4)), shard_axis(nn.ReLU())
(0, 1, -1)
>>> shard_axis(nn.Conv2d(4, 4, 3)), shard_axis(nn.Conv2d(4, 4, 3, groups=2))
(0, -1)
"""
from __future__ import annotations

import weakref

import numpy as np
from torch import nn

from .._kinds import NORM_KINDS

__all__ = ["SLICEABLE", "CONVOLUTIONS", "MEGATRON_STYLES", "NORMS", "ELEMENTWISE", "shard_axis",
           "declared_degree", "tensor_degree", "megatron_plan", "split_parameters",
           "unit_pairs"]

CONVOLUTIONS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
SLICEABLE: dict[type, int] = {nn.Linear: 0, nn.Embedding: 1,
                              **{c: 0 for c in CONVOLUTIONS}}
"""Module type → the weight axis of its output features (what a parameter split slices)."""

MEGATRON_STYLES = ("colwise-sharded", "colwise-qkv", "rowwise")
"""The ``tp_plan`` styles of a Megatron module: column-parallel with the output left sharded
(a fused q, k, v projection regrouped by heads), then row-parallel (the output summed)."""
_HEADS = ("n_head", "n_kv_head")
NORMS = tuple(getattr(nn, kind) for kind in NORM_KINDS)
"""The classes of :data:`memflow._kinds.NORM_KINDS`: normalizations a split runs whole on every
rank (no ``parallelize_module`` style shards their features)."""
ELEMENTWISE = frozenset({"ReLU", "GELU", "Tanh", "SiLU", "Sigmoid", "Dropout", "Identity",
                         "LeakyReLU"})
"""Parameter-free element-wise module kinds a Megatron pair may have between its linears."""


def shard_axis(module: nn.Module | None) -> int:
    """The weight axis a parameter split of ``module`` slices; -1 when it cannot be sliced."""
    axis = next((a for kind, a in SLICEABLE.items() if isinstance(module, kind)), -1)
    if isinstance(module, CONVOLUTIONS) and module.groups != 1:
        return -1
    return axis


def declared_degree(module: nn.Module) -> int:
    """The greatest common divisor of ``module``'s head counts (``n_head``, ``n_kv_head``) and
    the widths its declared ``tp_plan`` shards (output features of a column-parallel child,
    input features of a row-parallel one): the ranks its plan splits evenly divide it. 0 when
    it declares no Megatron plan of ``Linear`` children.

    >>> class MLP(nn.Sequential):
    ...     tp_plan = {"0": "colwise-sharded", "2": "rowwise"}
    >>> declared_degree(MLP(nn.Linear(4, 12), nn.ReLU(), nn.Linear(12, 4)))
    12
    """
    import math
    plan = getattr(module, "tp_plan", None)
    kids = dict(module.named_children())
    if not isinstance(plan, dict) or not plan or not all(
            style in MEGATRON_STYLES and isinstance(kids.get(c), nn.Linear)
            for c, style in plan.items()):
        return 0
    widths = [kids[c].in_features if style == "rowwise" else kids[c].out_features
              for c, style in plan.items()]
    heads = [int(getattr(module, k)) for k in _HEADS if isinstance(getattr(module, k, None), int)]
    return math.gcd(*widths, *heads)


def tensor_degree(module: nn.Module | None) -> int:
    """The largest degree Megatron's tensor parallelism splits ``module`` at (module
    docstring): a container whose every ``Linear`` is declared by a Megatron ``tp_plan`` and
    whose other weights are normalizations'; 0 for anything else.

    >>> class MLP(nn.Sequential):
    ...     tp_plan = {"0": "colwise-sharded", "2": "rowwise"}
    >>> block = nn.Sequential(nn.LayerNorm(4), MLP(nn.Linear(4, 6), nn.GELU(), nn.Linear(6, 4)))
    >>> tensor_degree(block), tensor_degree(nn.Sequential(nn.Linear(4, 4))), tensor_degree(None)
    (6, 0, 0)
    """
    import math
    if module is None or not any(True for _ in module.children()):
        return 0
    degree, declared = 0, set()
    for m in module.modules():
        d = declared_degree(m)
        if d:
            degree = math.gcd(degree, d)
            declared.update(id(getattr(m, c)) for c in m.tp_plan)
    for m in module.modules():
        weighted = any(True for _ in m.parameters(recurse=False))
        if isinstance(m, nn.Linear) and id(m) not in declared or weighted and not isinstance(
                m, (nn.Linear, *NORMS)):
            return 0
    return degree


def _join(*parts: str) -> str:
    return ".".join(p for p in parts if p)


def _chain(module: nn.Module) -> list[str] | None:
    """The children ``module``'s forward calls one after the other, each on the previous
    one's output alone (``torch.fx``); None when its forward is anything else."""
    from torch import fx
    try:
        nodes = list(fx.symbolic_trace(module).graph.nodes)
    except Exception:       # noqa: BLE001 - code fx cannot trace is no plain chain
        return None
    calls, prev = [], nodes[0] if nodes and nodes[0].op == "placeholder" else None
    for node in nodes[1:]:
        if node.op == "output":
            return calls if prev is not None and node.args == (prev,) else None
        if node.op != "call_module" or node.args != (prev,) or node.kwargs:
            return None
        calls.append(node.target)
        prev = node
    return None


def _inner_pairs(module: nn.Module) -> dict[str, str]:
    """Megatron pairs inside a split container: a module whose forward chains two ``Linear``
    with only element-wise modules between and after them (an MLP: ``fc``, ``act``, ``proj``,
    ``dropout``; checked with :func:`_chain`)."""
    out = {}
    for path, m in module.named_modules():
        kids = dict(m.named_children())
        kinds = [type(k).__name__ for k in kids.values()]
        if kinds.count("Linear") != 2 or not all(k in ELEMENTWISE or k == "Linear"
                                                 for k in kinds):
            continue
        calls = _chain(m)
        linear = [c for c in calls or () if type(kids.get(c)).__name__ == "Linear"]
        if calls and calls[0] == linear[0] and len(linear) == 2 and len(set(calls)) == len(calls):
            out[_join(path, linear[0])] = "colwise-sharded"
            out[_join(path, linear[1])] = "rowwise"
    return out


def megatron_plan(module: nn.Module, ranks: int | None = None) -> dict[str, str]:
    """Module path (relative to ``module``, a split unit's module; ``""`` itself) -> the
    ``parallelize_module`` style the tensor-parallel path shards it with: each ``Linear`` and
    ``Embedding`` inside column-parallel with its output gathered (``colwise``), a Megatron
    pair inside (:func:`_inner_pairs`) column- then row-parallel, and a declared module's
    ``tp_plan`` where ``ranks`` divides its :func:`declared_degree` (None: wherever it has one,
    as a valid strategy splits it). Convolutions are left out (no style shards one), and what
    no entry names (normalizations, other weights, buffers) runs whole on every rank.

    >>> class MLP(nn.Sequential):
    ...     tp_plan = {"0": "colwise-sharded", "2": "rowwise"}
    >>> block = nn.Sequential(nn.LayerNorm(4), MLP(nn.Linear(4, 6), nn.GELU(), nn.Linear(6, 4)),
    ...                       nn.Linear(4, 4))
    >>> megatron_plan(block)
    {'1.0': 'colwise-sharded', '1.2': 'rowwise', '2': 'colwise'}
    >>> megatron_plan(nn.Linear(4, 2)), megatron_plan(nn.LayerNorm(4))
    ({'': 'colwise'}, {})
    """
    plan = {path: "colwise" for path, m in module.named_modules()
            if isinstance(m, (nn.Linear, nn.Embedding))}
    if not plan:
        return plan
    plan.update(_inner_pairs(module))
    for path, m in module.named_modules():
        degree = declared_degree(m)
        if degree and (ranks is None or degree % ranks == 0):
            plan.update({_join(path, child): style for child, style in m.tp_plan.items()})
    return plan


def split_parameters(module: nn.Module, ranks: int | None = None,
                     rowwise: bool = False) -> set[str]:
    """The names (relative to ``module``) of the parameters a split of ``module`` shards on
    the tensor-parallel path (:func:`megatron_plan`; ``rowwise``: a ``Linear`` run
    row-parallel, the second of a pair of units, :func:`unit_pairs`): every parameter of a
    planned module but a row-parallel one's bias, which ``RowwiseParallel`` keeps replicated
    (added once, after the all-reduce). The others, and every buffer, stay whole on each rank.

    >>> class MLP(nn.Sequential):
    ...     tp_plan = {"0": "colwise-sharded", "2": "rowwise"}
    >>> sorted(split_parameters(nn.Sequential(nn.LayerNorm(4), MLP(nn.Linear(4, 6), nn.GELU(),
    ...                                                             nn.Linear(6, 4)))))
    ['1.0.bias', '1.0.weight', '1.2.weight']
    """
    plan = megatron_plan(module, ranks)
    if rowwise and isinstance(module, nn.Linear):
        plan[""] = "rowwise"
    out = set()
    for path, style in plan.items():
        for name, _ in module.get_submodule(path).named_parameters(recurse=False):
            if not (style == "rowwise" and name == "bias"):
                out.add(_join(path, name))
    return out


_CANDIDATES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _pair_candidates(graph) -> dict[int, int]:
    """``first -> second`` of ``Linear`` units of ``graph`` whose output reaches the next
    ``Linear`` only through element-wise module units between them (kept per graph: the
    simulator asks for every strategy)."""
    hit = _CANDIDATES.get(graph)
    if hit is not None:
        return hit
    kind = graph.units["kind"].to_numpy()
    role = graph.units["role"].to_numpy()
    names = list(graph.names)
    reads: dict[str, set[str]] = {}
    for p, c in zip(graph.tensors["producer"], graph.tensors["consumers"]):
        reads.setdefault(p, set()).update(c)
    out = {}
    for i in np.flatnonzero(kind == "Linear").tolist():
        k = i + 1
        while k < len(names) and kind[k] in ELEMENTWISE and role[k] == "module":
            k += 1
        chain = set(names[i:k + 1])
        if k < len(names) and kind[k] == "Linear" and all(
                reads.get(n, set()) <= chain for n in names[i:k]):
            out[i] = k
    _CANDIDATES[graph] = out
    return out


def unit_pairs(graph, parameter, devices) -> dict[int, int]:
    """Megatron pairs ``first -> second`` of split ``Linear`` units of ``graph`` (per unit
    its parameter degree and devices, a strategy's): a split ``Linear`` whose output flows,
    only through unsplit parameter-free element-wise units, into a split ``Linear`` on the
    same devices; the tensor-parallel path runs the first column-parallel, its output left
    sharded, and the second row-parallel (``memflow.export.tensor_parallel``)."""
    if graph is None:
        return {}
    parameter = np.asarray(parameter)
    pairs: dict[int, int] = {}
    for i, k in _pair_candidates(graph).items():
        if parameter[i] > 1 and parameter[k] > 1 and (parameter[i + 1:k] == 1).all() \
                and devices[k] == devices[i] and i not in pairs.values():
            pairs[i] = k
    return pairs
