"""The pieces the tensor-parallel plan (:mod:`memflow.export.tensor_parallel`) runs with:
its ``parallelize_module`` styles (:func:`styles`, a fused q, k, v projection regrouped by heads
among them: :func:`_regroup`), gradients gathered back in the model's own layout
(:func:`full_gradients`), the sequence's relayouts (:func:`relayout`), Megatron's saving of a
gathered input (:class:`PartSaved`) and a tied weight read whole (:func:`read_full`)."""
from __future__ import annotations

import torch
from torch import nn

__all__ = ["styles", "full_gradients", "relayout", "on_stream", "PartSaved", "read_full",
           "SEQUENCE_DIM"]

SEQUENCE_DIM = 1
"""The sequence dimension of ``(batch, sequence, hidden)`` activations."""


def relayout(mesh, source, target):
    """A function moving a local tensor laid out ``source`` on ``mesh`` to ``target``,
    differentiably (DTensor redistributes the gradient back)."""
    from torch.distributed.tensor import DTensor

    def move(x):
        if not isinstance(x, torch.Tensor):
            return x
        return DTensor.from_local(x, mesh, [source], run_check=False).redistribute(
            mesh, [target]).to_local()
    return move


def on_stream(move):
    """``move`` applied to a module call's residual stream, its first positional argument,
    the others passed as they are: a block's other inputs (Llama's rotary ``cos`` and
    ``sin``, a mask) span the whole sequence on every rank, as torchtitan's
    ``PrepareModuleInput(input_layouts=(Shard(1), None))`` leaves its ``freqs_cis``.

    >>> on_stream(lambda x: -x)((torch.ones(1), torch.ones(1)))
    (tensor([-1.]), tensor([1.]))
    """
    def call(args):
        return (move(args[0]), *args[1:]) if args else args
    return call


def _regroup(rows: torch.Tensor, ranks: int, inverse: bool = False) -> torch.Tensor:
    """A fused projection's rows ``[q | k | v]`` (each in head order) regrouped
    ``[q_0 k_0 v_0 | q_1 k_1 v_1 | ...]``, ``x_r`` the rows of rank ``r``'s heads; ``inverse``
    undoes it.

    >>> rows = _regroup(torch.arange(6), 2)
    >>> rows.tolist(), _regroup(rows, 2, inverse=True).tolist()
    ([0, 2, 4, 1, 3, 5], [0, 1, 2, 3, 4, 5])
    """
    shape = (ranks, 3, -1) if inverse else (3, ranks, -1)
    return rows.unflatten(0, shape).transpose(0, 1).flatten(0, 2)


def full_gradients(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's gradient as one full tensor in the model's own layout (a DTensor
    shard gathered, a regrouped ``qkv`` put back in order), by parameter name.

    >>> full_gradients(nn.Linear(2, 1))     # no gradient yet
    {}
    """
    out = {}
    for path, m in model.named_modules():
        for name, p in m.named_parameters(recurse=False):
            if p.grad is None:
                continue
            g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
            ranks = getattr(m, "_qkv_ranks", None)
            out[f"{path}.{name}" if path else name] = _regroup(g, ranks, True) if ranks else g
    return out


def styles():
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   SequenceParallel)

    class QKVColwise(ColwiseParallel):
        """``ColwiseParallel`` left sharded on a fused q, k, v projection, its rows regrouped
        (:func:`_regroup`) so that each rank's shard holds the q, k and v of its heads."""

        def _partition_linear_fn(self, name, module, device_mesh):
            ranks = device_mesh.size()
            for n, p in module.named_parameters():
                regrouped = distribute_tensor(_regroup(p.detach(), ranks), device_mesh,
                                              [Shard(0)], src_data_rank=self.src_data_rank)
                module.register_parameter(n, nn.Parameter(regrouped, p.requires_grad))
            module._qkv_ranks = ranks

    return {"colwise": lambda: ColwiseParallel(output_layouts=Replicate()),
            "colwise-sharded": ColwiseParallel, "colwise-qkv": QKVColwise,
            "rowwise": RowwiseParallel,
            "sequence": lambda: SequenceParallel(sequence_dim=SEQUENCE_DIM,
                                                 use_local_output=True)}


class PartSaved:
    """A sequence-gathered child's entry (its inputs all-gathered) saving as Megatron does
    (Korthikanti et al. 2022): what autograd saves of a gathered input (a linear's input)
    keeps the rank's part, gathered again when backward needs it — PyTorch would save the
    whole sequence. The saved-tensor hooks hold while the child runs."""

    def __init__(self, gather):
        self.gather, self.parts, self.hooks = gather, {}, None

    def enter(self, module, args):
        full = on_stream(self.gather)(args)
        self.parts = {full[0].untyped_storage()._cdata: args[0]} \
            if args and isinstance(full[0], torch.Tensor) else {}
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)
        self.hooks.__enter__()
        return full

    def exit(self, module, args, out):
        self.hooks.__exit__(None, None, None)
        self.parts = {}

    def pack(self, t):
        local = getattr(t, "_local_tensor", t)      # a DTensor's (a parallel linear's input)
        part = self.parts.get(local.untyped_storage()._cdata)
        if part is None:
            return t
        return (PartSaved, part, local.size(), local.stride(), local.storage_offset(),
                getattr(t, "_spec", None), t.requires_grad)

    def unpack(self, saved):
        if not (isinstance(saved, tuple) and saved[0] is PartSaved):
            return saved
        from torch.distributed.tensor import DTensor
        _, part, size, stride, offset, spec, grad = saved
        local = self.gather(part).as_strided(size, stride, offset)
        return local if spec is None else DTensor(local, spec, requires_grad=grad)


def read_full(module: nn.Module, name: str) -> None:
    """``module`` reads parameter ``name`` (a DTensor shard) as the full tensor while it runs:
    an instance attribute shadows the parameter for the call. The gathered weight's storage
    is noted in ``module._tp_gathered``: a weight, not an activation, though its matmul saves
    it (FSDP2's gathered parameters are alike)."""
    def gather(mod, args):
        full = mod.__dict__[name] = mod._parameters[name].full_tensor()
        mod._tp_gathered = {full.untyped_storage()._cdata}

    def drop(mod, args, output):
        mod.__dict__.pop(name, None)
    module.register_forward_pre_hook(gather)
    module.register_forward_hook(drop)
