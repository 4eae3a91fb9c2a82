"""Tensor parallelism across processes: a strategy's parameter splits run as DTensor shards.

Units with a parameter split run under ``parallelize_module`` on a ``DeviceMesh`` over their
parameter group, one process per device of the group. With data-parallel replicas (every unit
the same sample degree) the processes form a ``replicas × group`` grid: rank ``r * p + t`` is
device ``t`` of replica ``r``'s group (:func:`tensor_ranks`), and gradients are averaged over
the replicas after each step. Every other unit runs replicated on every rank (SPMD: each rank
computes it on the same full tensors, so its gradients agree without communication), where
FlexFlow would run it on one device while the others wait; the simulator charges it so, on
every device of the group (:mod:`memflow.strategy.tensor_groups`, :mod:`memflow.sim.replication`).

The plan (:func:`tensor_plan`), per split unit, in FlexFlow's per-unit semantics — the next
unit sees the whole tensor — unless two adjacent linears allow Megatron's pairing:

* ``Linear``: ``ColwiseParallel`` with its output gathered (``Replicate``): an all-gather of
  the output in forward, an all-reduce of the input gradient in backward;
* ``Embedding``: ``ColwiseParallel``, the embedding dimension sharded and the output gathered
  (memflow's and FlexFlow's parameter dimension of an embedding);
* a **Megatron pair**: a split ``Linear`` whose output flows, only through parameter-free
  element-wise units (activations, dropout), into a split ``Linear`` on the same group runs
  column-parallel with its output left sharded, and the second row-parallel
  (``RowwiseParallel``, its output all-reduced): one all-reduce in forward and one in backward
  for the pair. This needs the graph (its tensors say where each output flows);
* a unit that is a container (a block, an MLP, an attention): each ``Linear`` and
  ``Embedding`` inside it as above, gathered, but a Megatron pair inside it (a module of
  leaves: ``Linear``, element-wise modules, ``Linear``, element-wise modules — an MLP) runs
  column- then row-parallel (its hidden activations split), and so does a **declared
  Megatron module**: one that declares ``tp_plan`` (its children's styles, as Hugging Face's
  ``base_model_tp_plan`` does; the zoo's GPT-2, BERT and Llama attentions, Llama's SwiGLU
  MLP: gate and up column-parallel, down row-parallel) and whose heads (``n_head``,
  ``n_kv_head``) and sharded widths divide among the ranks. Each rank runs attention on its
  heads: separate q, k, v projections column-parallel (whole heads are contiguous rows, the
  grouped key/value heads too), a fused ``qkv`` (``colwise-qkv``) with its rows regrouped
  first — q, k, v of rank 0's heads, then rank 1's — the output projection row-parallel.
  The module's forward must read its head count from the widths it gets (torchtitan's
  ``view(b, s, -1, head_dim)``). A regrouped weight's full tensor is in the regrouped
  order: :func:`full_gradients` puts it back;
* a normalization (``LayerNorm``, ``RMSNorm``, ``GroupNorm``): replicated, as an unsplit unit
  (its weights are one vector; sharding its features would need its statistics all-reduced).

**Sequence parallelism** (a split unit's ``sequence_parallel``; Korthikanti et al. 2022, as
torchtitan writes it) runs on normalizations and containers: the residual stream they pass
between each other is sharded over the sequence (dimension 1, ``(batch, sequence, hidden)``).
A normalization runs ``SequenceParallel`` (its weights replicated DTensors, their gradients
all-reduced); inside a container, each normalization does, and each child holding a
``Linear`` all-gathers the sequence on entry and keeps its rank's part on exit (the linears
split as above). The stream is scattered (each rank keeps its part, no communication) where a
sequence-parallel unit follows another unit, and all-gathered where another unit follows it.
Only the stream, a call's first positional argument, is relaid out (:func:`on_stream`): a
block's other inputs (Llama's rotary ``cos`` and ``sin``) are whole on every rank, as
torchtitan's ``PrepareModuleInput(input_layouts=(Shard(1), None))`` leaves ``freqs_cis``.
Where the search may set it: :mod:`memflow.strategy.sequence_parallel`.
Megatron reduce-scatters at the row-parallel linear instead of all-reducing and keeping a
part: the same result, twice the bytes on the links in forward here.

What the simulator charges (``memflow.sim.structure``: ``tp_out``/``tp_in``): every split unit
all-reduces its whole output in forward and its input gradient in backward. For a Megatron
pair that is twice what runs (one all-reduce each way for the pair); for a gathered
column-parallel unit the forward is an all-gather, half an all-reduce. So the simulator is
pessimistic for tensor parallelism. Model states it charges as run here: the plan of a unit's
module is :func:`memflow.graph.slicing.megatron_plan`, whose sharded parameters
(:func:`~memflow.graph.slicing.split_parameters`) capture records per storage (the parameters
table's ``tensor_split``); the simulator charges those at ``1/p`` per device and the rest of a
split unit (its normalizations, a row-parallel bias, buffers) whole on every rank, as it
charges unsplit units (:mod:`memflow.sim.replication`); the pairs of ``Linear`` units are
:func:`memflow.graph.slicing.unit_pairs` for both.

Refused (:class:`~memflow.errors.ExportError`, naming the unit): split convolutions (no
``parallelize_module`` style shards a convolution), glue, split units on different groups,
an unsplit unit off its replica's group, per-unit sample degrees, pipeline stages (the pipeline
path runs splits inside stages: :mod:`memflow.export.stage_tensor`), offload or
compression of a split unit (what it saves are DTensors; keep and recompute run). A weight
tied between a split unit and an unsplit one (GPT-2's head and embedding) stays tied: the
unsplit module reads the full weight (``full_tensor``, differentiable) while it runs.

>>> from memflow.strategy import Strategy
>>> s = Strategy(["0", "1", "2"], devices=[("gpu0", "gpu1"), ("gpu0",), ("gpu0", "gpu1")],
...              parameter=[2, 1, 2])
>>> tensor_ranks(s)
{'gpu0': 0, 'gpu1': 1}
>>> dp = Strategy(["0", "1"], devices=[("gpu0", "gpu1", "gpu2", "gpu3"), ("gpu0", "gpu2")],
...               sample=[2, 2], parameter=[2, 1])
>>> tensor_ranks(dp)
{'gpu0': 0, 'gpu1': 1, 'gpu2': 2, 'gpu3': 3}
>>> from torch import nn
>>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))
>>> tensor_plan(model, s)
{'0': 'colwise', '2': 'colwise'}
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ..errors import ExportError
from ..graph.slicing import NORMS, megatron_plan, unit_pairs
from ..graph.units import LOSS
from ..strategy.policies import M_COMPRESSED, M_HOST, POLICIES
from ..strategy.tensor_groups import tensor_groups as groups_of
from .spans import check_modules, unit_spans
from .tp_styles import (SEQUENCE_DIM, PartSaved, full_gradients, on_stream, read_full, relayout,
                        styles)

__all__ = ["tensor_groups", "tensor_ranks", "tensor_plan", "parallelize", "full_gradients",
           "STYLES"]

STYLES = ("colwise", "colwise-sharded", "colwise-qkv", "rowwise", "sequence",
          "sequence-gathered")
"""Plan entries: column-parallel gathered, column-parallel left sharded (first of a pair),
the same for a fused q, k, v projection regrouped by heads, row-parallel (second of a pair),
a normalization on its rank's part of the sequence, a container's child run on the whole
sequence (sequence parallelism)."""


def tensor_groups(strategy) -> list[tuple[str, ...]]:
    """Per data-parallel replica, the devices of the parameter group every split unit of that
    replica uses (:func:`memflow.strategy.tensor_groups.tensor_groups`: its reason raised
    here); ``[]`` when no unit is split."""
    groups = groups_of(strategy)
    if isinstance(groups, str):
        raise ExportError(groups)
    return groups


def tensor_ranks(strategy) -> dict[str, int]:
    """The rank of each device: ``replica * group size + position in its group``."""
    groups = tensor_groups(strategy)
    return {d: r * len(g) + t for r, g in enumerate(groups) for t, d in enumerate(g)}


def tensor_plan(model: nn.Module, strategy, graph=None) -> dict[str, str]:
    """Module path -> style (:data:`STYLES`) of every module the split units shard; what
    cannot run (module docstring) raises :class:`~memflow.errors.ExportError` here, before
    any process starts."""
    tensor_groups(strategy)
    spans = unit_spans(strategy.units, graph)
    modules = check_modules(model, spans)
    split = {s.index for s in spans if int(strategy.parameter[s.index]) > 1}
    pairs = unit_pairs(graph, strategy.parameter, strategy.devices)
    plan: dict[str, str] = {}
    for s in spans:
        if s.index not in split:
            continue
        if s.role != "module" or s.module == LOSS:
            raise ExportError(f"unit {s.name!r} is glue (its module's own code), which export "
                              "cannot split over parameters; use parameter=1 for it")
        module = modules[s.module]
        inside = [(_at(s.module, p), m) for p, m in module.named_modules()
                  if isinstance(m, (nn.Linear, nn.Embedding, nn.Conv1d, nn.Conv2d, nn.Conv3d))]
        if not inside and not isinstance(module, NORMS):
            raise ExportError(f"unit {s.name!r} ({type(module).__name__}) holds no Linear or "
                              "Embedding to shard; use parameter=1 for it")
        for path, m in inside:
            if not isinstance(m, (nn.Linear, nn.Embedding)):
                raise ExportError(f"unit {s.name!r}: {path} is a {type(m).__name__}, which "
                                  "tensor parallelism (parallelize_module) cannot shard; use "
                                  "parameter=1 for it")
        _check_declared(s.module, module)
        # the one rule the simulator charges by too (capture's tensor_split column)
        plan.update({_at(s.module, path): style for path, style in
                     megatron_plan(module, int(strategy.parameter[s.index])).items()})
        if strategy.sequence_parallel[s.index]:
            plan.update(_sequence_plan(s, module, bool(inside)))
        if s.index in pairs:
            plan[s.module] = "colwise-sharded"
        elif s.index in pairs.values():
            plan[s.module] = "rowwise"
    moved = POLICIES.mechanism_codes[strategy.policy]
    for i in np.flatnonzero((strategy.parameter > 1) & np.isin(moved, (M_HOST, M_COMPRESSED))):
        raise ExportError(f"unit {strategy.units[i]!r} is split over parameters and "
                          f"{strategy.policies[i]!r}: what it saves for backward are DTensors, "
                          "which export's offload and compression do not move. Valid there: "
                          "keep or recompute")
    for i in np.flatnonzero((strategy.parameter > 1) & POLICIES.recomputes(strategy.policy)):
        if any(p.startswith(spans[i].module + ".") for p in plan):
            raise ExportError(f"unit {strategy.units[i]!r} is split over parameters and "
                              "recomputed, but it is a container: DTensor's conversions run "
                              "inside it, which recompute cannot replay. Valid: keep, or "
                              "recompute at a finer granularity (its Linear units)")
    return plan


def _check_declared(prefix: str, module: nn.Module) -> None:
    """Raise where a module inside a split unit declares a ``tp_plan`` export cannot run."""
    for path, m in module.named_modules():
        declared = getattr(m, "tp_plan", None)
        if not isinstance(declared, dict):
            continue
        kids = dict(m.named_children())
        for child, style in declared.items():
            if style not in STYLES or not isinstance(kids.get(child), nn.Linear):
                raise ExportError(f"{type(m).__name__}.tp_plan at {_at(prefix, path)!r}: "
                                  f"{child!r} -> {style!r}; valid: a Linear child -> one of "
                                  f"{STYLES}")


def _at(prefix: str, path: str) -> str:
    return f"{prefix}.{path}" if path else prefix


def _sequence_plan(span, module: nn.Module, container: bool) -> dict[str, str]:
    """The sequence-parallel entries of a split unit (module docstring)."""
    if isinstance(module, NORMS):
        return {span.module: "sequence"}
    if not container or isinstance(module, (nn.Linear, nn.Embedding)):
        raise ExportError(f"unit {span.name!r} ({type(module).__name__}) is sequence parallel, "
                          "which export runs on normalizations and containers (blocks) only. "
                          "Valid: sequence_parallel=False for it")
    plan = {}
    for name, child in module.named_children():
        if isinstance(child, NORMS):
            plan[f"{span.module}.{name}"] = "sequence"
        elif any(isinstance(m, nn.Linear) for m in child.modules()):
            plan[f"{span.module}.{name}"] = "sequence-gathered"
    return plan


def _sequence_hooks(model, strategy, graph, mesh, plan, after: bool) -> None:
    """The stream's relayouts (module docstring): before ``parallelize_module`` (``after``
    False) the entries, so they run before its own input hooks; after it the exits."""
    from torch.distributed.tensor import Replicate, Shard
    whole, part = Replicate(), Shard(SEQUENCE_DIM)
    gather, scatter = relayout(mesh, part, whole), relayout(mesh, whole, part)
    spans = unit_spans(strategy.units, graph)
    modules = check_modules(model, spans)
    for path, style in plan.items():
        if style == "sequence-gathered":
            m = model.get_submodule(path)
            if not after:
                saves = PartSaved(gather)
                m.register_forward_pre_hook(saves.enter)
                m.register_forward_hook(saves.exit)
            else:
                m.register_forward_hook(lambda mod, args, out: scatter(out))
    seq = [bool(strategy.sequence_parallel[s.index]) and s.module in modules for s in spans]
    for k, s in enumerate(spans):
        if not seq[k]:
            continue
        m = modules[s.module]
        if not after and (k == 0 or not seq[k - 1]):
            m.register_forward_pre_hook(lambda mod, args: on_stream(scatter)(args))
        if after and (k + 1 == len(spans) or not seq[k + 1]):
            m.register_forward_hook(lambda mod, args, out: gather(out))


def parallelize(model: nn.Module, strategy, mesh, graph=None) -> nn.Module:
    """``model`` (changed in place) running ``strategy``'s parameter splits on ``mesh`` (a 1-D
    ``DeviceMesh`` over this replica's group, :func:`tensor_ranks`) and its memory policies
    (:func:`memflow.export.apply`); returns the :class:`~memflow.export.Exported` model.
    """
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import parallelize_module
    from .exported import apply

    plan = tensor_plan(model, strategy, graph)
    groups = tensor_groups(strategy)
    if groups and mesh.size() != len(groups[0]):
        raise ExportError(f"the tensor-parallel group has {len(groups[0])} devices; the mesh "
                          f"has {mesh.size()} ranks")
    holders: dict[int, list[tuple[nn.Module, str]]] = {}
    for m in model.modules():
        for name, p in m._parameters.items():
            if p is not None:
                holders.setdefault(id(p), []).append((m, name))
    made = styles()
    _sequence_hooks(model, strategy, graph, mesh, plan, after=False)
    parallelize_module(model, mesh, {path: made[style]() for path, style in plan.items()
                                     if style in made})
    _sequence_hooks(model, strategy, graph, mesh, plan, after=True)
    for uses in holders.values():
        sharded = [(m, n) for m, n in uses if isinstance(m._parameters[n], DTensor)]
        if len(uses) < 2 or not sharded:
            continue
        if len(sharded) > 1:
            raise ExportError(f"a weight is tied between {len(sharded)} split modules; each "
                              "would shard its own copy. Split at most one of them")
        owner, name = sharded[0]
        for m, n in uses:
            if (m, n) != (owner, name):
                m._parameters[n] = owner._parameters[name]
                read_full(m, n)
    spans = unit_spans(strategy.units, graph)
    modules = check_modules(model, spans)
    for s, after in zip(spans, spans[1:]):
        if s.module in plan and getattr(modules.get(after.module), "inplace", False):
            # a shard's output is a view made by DTensor's autograd function, which autograd
            # forbids writing in place: the next unit (an in-place ReLU) gets a copy
            modules[s.module].register_forward_hook(lambda m, a, out: out.clone())
    one = type(strategy)(strategy.units, devices=[("tp",)] * len(strategy),
                         policy=strategy.policy, error_bound=strategy.error_bound,
                         segment_break=strategy.segment_break, precision=strategy.precision,
                         offload_optimizer=strategy.offload_optimizer, name=strategy.name)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    return apply(model, one, graph, inplace=True, devices={"tp": device})

