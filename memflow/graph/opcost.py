"""What one aten op costs: FLOPs, bytes read and written, kernels launched.

FLOPs come from ``torch.utils.flop_counter.flop_registry`` (matrix products, convolutions,
fused attention) where it has a formula, and otherwise from the op's class:

* views (``aten.view``, ``aten.t``, ``aten.expand``…) and bare allocations (``aten.empty``…)
  cost nothing and launch no kernel;
* pointwise ops (``torch.Tag.pointwise``) cost one FLOP per output element;
* reductions and normalizations cost a few FLOPs per input element (:data:`PER_ELEMENT`);
* data movement (copies, concatenation, indexing, random fills) costs bytes but no FLOPs;
* anything else is counted as zero FLOPs with one warning per op name — never an error.

Bytes moved are the sizes of the op's tensor inputs and outputs (the tensors, not their whole
storages): the traffic a roofline model charges.

A matrix product or convolution also gets its *kernel shape* (:func:`kernel_shape`): its class
(:data:`KERNEL_CLASSES`) and the sizes ``m``, ``n``, ``k`` of the matrix product it is (a
convolution as the implicit GEMM it lowers to), repeated ``count`` times: what sets a CPU
kernel's achieved rate, which falls by several times on small or thin operands at the same
FLOPs (``docs/data-model.md``, units column ``kernels``).

>>> import torch
>>> counter = OpCounter()
>>> a, b = torch.ones(8, 16), torch.ones(16, 4)
>>> out = torch.mm(a, b)
>>> c = counter.cost(torch.ops.aten.mm.default, (a, b), {}, out)
>>> c.flops, c.bytes_moved, c.kernels, c.shape
(1024.0, 896, 1, ('matmul', 8, 4, 16, 1))
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, Iterator

import torch
from torch.utils import flop_counter

__all__ = ["OpCost", "OpCounter", "tensors_in", "PER_ELEMENT", "DATA_MOVEMENT",
           "KERNEL_CLASSES", "kernel_shape"]

aten = torch.ops.aten


@dataclass(frozen=True)
class OpCost:
    """FLOPs, bytes read + written, and kernel launches of one op."""

    flops: float
    bytes_moved: int
    kernels: int
    shape: tuple[str, int, int, int, int] | None = None   # kernel_shape(); None: not a GEMM


def tensors_in(obj: Any) -> Iterator[torch.Tensor]:
    """The tensors in an op's arguments or results (flat, nested lists and tuples, dict values)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from tensors_in(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from tensors_in(item)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


# FLOPs per element of the largest input, for reductions and fused normalizations:
# softmax is max, subtract, exp, sum, divide; a normalization is mean, variance, scale, shift.
PER_ELEMENT: dict[Any, float] = {
    aten._softmax: 5, aten._log_softmax: 5, aten._safe_softmax: 5, aten._softmax_backward_data: 3,
    aten._log_softmax_backward_data: 3,
    aten.native_layer_norm: 8, aten.native_layer_norm_backward: 12,
    aten.native_batch_norm: 8, aten._native_batch_norm_legit: 8,
    aten._native_batch_norm_legit_functional: 8, aten._native_batch_norm_legit_no_training: 4,
    aten.native_batch_norm_backward: 12, aten.native_group_norm: 8,
    aten.native_group_norm_backward: 12,
    aten.nll_loss_forward: 1, aten.nll_loss_backward: 1, aten.nll_loss2d_forward: 1,
    aten.nll_loss2d_backward: 1, aten.mse_loss: 3, aten.mse_loss_backward: 3,
    aten.binary_cross_entropy_with_logits: 6,
    aten.embedding_dense_backward: 1, aten.native_dropout: 2, aten._embedding_bag: 1,
    aten.max_pool2d_with_indices: 1, aten.max_pool2d_with_indices_backward: 1,
    aten.max_pool3d_with_indices: 1, aten.avg_pool2d: 1, aten.avg_pool2d_backward: 1,
    aten.avg_pool3d: 1, aten._adaptive_avg_pool2d: 1, aten._adaptive_avg_pool2d_backward: 1,
    aten.adaptive_max_pool2d: 1, aten.adaptive_max_pool2d_backward: 1,
    aten.upsample_nearest2d: 1, aten.upsample_bilinear2d: 4,
    aten.upsample_nearest2d_backward: 1, aten.upsample_bilinear2d_backward: 4,
    aten._thnn_fused_lstm_cell: 10, aten._thnn_fused_lstm_cell_backward_impl: 10,
    aten._thnn_fused_gru_cell: 10, aten._thnn_fused_gru_cell_backward: 10,
    aten.cumsum: 1, aten.cumprod: 1, aten.logsumexp: 3, aten.sort: 1, aten.topk: 1,
}

# Ops that move or fill memory without arithmetic.
DATA_MOVEMENT = frozenset({
    aten.clone, aten.copy_, aten._to_copy, aten.copy, aten.cat, aten.stack, aten.index_select,
    aten.gather, aten.scatter, aten.scatter_, aten.scatter_add, aten.scatter_add_,
    aten.embedding, aten.index, aten.index_put, aten.index_put_, aten._unsafe_index,
    aten._unsafe_index_put, aten.index_add, aten.index_add_, aten.index_copy,
    aten.fill_, aten.fill, aten.zero_, aten.zeros, aten.ones, aten.full, aten.zeros_like,
    aten.ones_like, aten.full_like, aten.new_zeros, aten.new_ones, aten.new_full,
    aten.arange, aten.linspace, aten.eye, aten.scalar_tensor, aten.lift_fresh_copy,
    aten.bernoulli, aten.bernoulli_, aten.uniform_, aten.normal_, aten.rand, aten.randn,
    aten.randint, aten.rand_like, aten.randn_like, aten.randperm, aten.exponential_,
    aten.constant_pad_nd, aten.reflection_pad2d, aten.replication_pad2d, aten.repeat,
    aten.repeat_interleave, aten.flip, aten.roll, aten.tril, aten.triu, aten.tril_, aten.triu_,
    aten.slice_scatter, aten.select_scatter, aten.diagonal_scatter, aten.as_strided_scatter,
    aten.slice_backward, aten.select_backward, aten.diagonal_backward,
    aten.split_with_sizes_copy, aten.unbind_copy, aten.masked_scatter, aten.masked_select, aten.masked_fill, aten.masked_fill_,
    aten.nonzero, aten.one_hot, aten.contiguous, aten.resize_, aten.set_,
    aten._local_scalar_dense, aten.item, aten.equal, aten.is_nonzero, aten._reshape_copy,
    aten.detach_copy, aten.alias_copy, aten.view_copy, aten.t_copy, aten.expand_copy,
    aten.permute_copy, aten.transpose_copy, aten.unsqueeze_copy, aten.squeeze_copy,
    aten._unsafe_view, aten.im2col, aten.col2im, aten.pixel_shuffle, aten.pixel_unshuffle,
    aten.pad, aten.native_dropout_backward, aten.tensor_split, aten.count_nonzero,
})

# Views that the schema does not flag as such.
_VIEWS = frozenset({aten.detach, aten.lift_fresh, aten.alias, aten.unsafe_split,
                    aten.unsafe_split_with_sizes, aten.unsafe_chunk})

# Allocations without a kernel.
_ALLOCATIONS = frozenset({aten.empty, aten.empty_like, aten.empty_strided, aten.new_empty,
                          aten.new_empty_strided, aten.empty_permuted})


def _rnn_layer_flops(args: tuple, out: Any, backward: bool) -> float:
    # mkldnn_rnn_layer(input, w_ih, w_hh, ...): 4 gates of input and hidden matmuls per step,
    # plus ~10 pointwise ops per hidden unit; backward does the matmuls twice.
    x, w_ih, w_hh = args[0], args[1], args[2]
    steps_batch = x.shape[0] * x.shape[1]
    matmul = 2.0 * steps_batch * (w_ih.shape[0] * w_ih.shape[1] + w_hh.shape[0] * w_hh.shape[1])
    pointwise = 10.0 * steps_batch * w_hh.shape[1]
    return (2 * matmul if backward else matmul) + pointwise


def _cpu_flash_flops(args: tuple, backward: bool) -> float:
    if backward:       # (grad_out, query, key, value, ...)
        return float(flop_counter.sdpa_backward_flop_count(*(tuple(t.shape) for t in args[:4])))
    return float(flop_counter.sdpa_flop_count(*(tuple(t.shape) for t in args[:3])))


def _matvec_flops(args: tuple) -> float:
    # mv(matrix, vector) / addmv(bias, matrix, vector) / dot(a, b): a multiply-add per element.
    matrix = args[1] if len(args) > 2 else args[0]
    return 2.0 * matrix.numel()


_SPECIAL = {
    aten.mv: lambda args, out: _matvec_flops(args),
    aten.addmv: lambda args, out: _matvec_flops(args),
    aten.dot: lambda args, out: _matvec_flops(args),
    aten.vdot: lambda args, out: _matvec_flops(args),
    aten.mkldnn_rnn_layer: lambda args, out: _rnn_layer_flops(args, out, False),
    aten.mkldnn_rnn_layer_backward: lambda args, out: _rnn_layer_flops(args, out, True),
    aten._scaled_dot_product_flash_attention_for_cpu: lambda args, out: _cpu_flash_flops(
        args, False),
    aten._scaled_dot_product_flash_attention_for_cpu_backward: lambda args, out:
        _cpu_flash_flops(args, True),
}


KERNEL_CLASSES = ("matmul", "conv", "conv1x1")
"""Kernel classes of :func:`kernel_shape`: matrix products (``mm``, ``addmm``, ``bmm``,
``baddbmm``), convolutions with a spatial kernel, and 1x1 (pointwise) convolutions, which a CPU
runs by another path (a matrix product per sample on one thread) at their own rate."""

_GEMMS = {aten.mm: 0, aten.addmm: 1, aten.bmm: 0, aten.baddbmm: 1}   # where its operands start


def kernel_shape(func: Any, args: tuple, out: Any) -> tuple[str, int, int, int, int] | None:
    """``(class, m, n, k, count)`` of a matrix product or convolution: ``count`` products of an
    ``m x k`` by a ``k x n`` matrix (``2 m n k count`` FLOPs); None for any other op.

    A convolution is its implicit GEMM: ``m`` output positions (batch x output spatial), ``n``
    output channels and ``k`` input channels x kernel positions per group, ``count`` groups.
    A transposed convolution is not classed (the time model charges it by FLOPs alone).

    >>> import torch
    >>> x, w = torch.ones(8, 16, 4, 4), torch.ones(32, 16, 1, 1)
    >>> kernel_shape(aten.convolution.default, (x, w, None, [1, 1], [0, 0], [1, 1], False,
    ...                                         [0, 0], 1), torch.ones(8, 32, 4, 4))
    ('conv1x1', 128, 32, 16, 1)
    """
    packet = getattr(func, "overloadpacket", None)
    if packet in _GEMMS:
        a, b = args[_GEMMS[packet]], args[_GEMMS[packet] + 1]
        count = a.shape[0] if a.dim() == 3 else 1
        return "matmul", int(a.shape[-2]), int(b.shape[-1]), int(a.shape[-1]), int(count)
    if (packet is aten.convolution and len(args) >= 9 and not args[6]
            and isinstance(out, torch.Tensor)):
        weight, groups = args[1], int(args[8])
        spatial = math.prod(weight.shape[2:])
        return ("conv1x1" if spatial == 1 else "conv",
                int(out.shape[0] * math.prod(out.shape[2:])), int(weight.shape[0] // groups),
                int(weight.shape[1] * spatial), groups)
    return None


class OpCounter:
    """Costs of aten ops; warns once per op name whose FLOPs it cannot count."""

    def __init__(self) -> None:
        self._kinds: dict[Any, str] = {}
        self.uncounted: set[str] = set()

    def _kind(self, func: Any) -> str:
        kind = self._kinds.get(func)
        if kind is None:
            packet = func.overloadpacket
            if packet in flop_counter.flop_registry:
                kind = "registry"
            elif packet in _SPECIAL:
                kind = "special"
            elif func.is_view or packet in _VIEWS or torch.Tag.inplace_view in func.tags:
                kind = "view"
            elif packet in _ALLOCATIONS:
                kind = "alloc"
            elif packet in PER_ELEMENT:
                kind = "per_element"
            elif torch.Tag.pointwise in func.tags:
                kind = "pointwise"
            elif torch.Tag.reduction in func.tags:
                kind = "reduction"
            elif packet in DATA_MOVEMENT:
                kind = "move"
            else:
                kind = "unknown"
            self._kinds[func] = kind
        return kind

    def cost(self, func: Any, args: tuple, kwargs: dict, out: Any) -> OpCost:
        """FLOPs, bytes moved and kernels of ``func(*args, **kwargs) -> out``."""
        kind = self._kind(func)
        if kind in ("view", "alloc"):
            return OpCost(0, 0, 0)
        ins = list(tensors_in(args)) + list(tensors_in(kwargs))
        outs = list(tensors_in(out))
        moved = sum(map(_nbytes, ins)) + sum(map(_nbytes, outs))
        try:
            flops = self._flops(kind, func, args, kwargs, out, ins, outs)
        except Exception as err:  # a formula that cannot read these arguments
            self._warn(func, f"its FLOP formula failed ({type(err).__name__}: {err})")
            flops = 0.0
        return OpCost(flops, moved, 1, kernel_shape(func, args, out))

    def _flops(self, kind: str, func: Any, args: tuple, kwargs: dict, out: Any,
               ins: list, outs: list) -> float:
        packet = func.overloadpacket
        if kind == "registry":
            return float(flop_counter.flop_registry[packet](*args, **kwargs, out_val=out))
        if kind == "special":
            return float(_SPECIAL[packet](args, out))
        if kind == "pointwise":
            return float(max((t.numel() for t in outs), default=0))
        if kind in ("per_element", "reduction"):
            per = PER_ELEMENT.get(packet, 1)
            return float(per * max((t.numel() for t in ins), default=0))
        if kind == "move":
            return 0.0
        self._warn(func, "memflow has no FLOP formula for it")
        return 0.0

    def _warn(self, func: Any, why: str) -> None:
        name = str(func.overloadpacket)
        if name not in self.uncounted:
            self.uncounted.add(name)
            warnings.warn(f"capture counts the FLOPs of op {name} as 0: {why}", stacklevel=2)
