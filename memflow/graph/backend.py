"""Backend rules: what autograd saves depends on the device a model trains on.

Capture runs a model on fake CPU tensors, so by itself it reproduces what CPU autograd saves.
A :class:`Backend` names the device it models and the rules that change what is saved there;
``from_torch(..., backend=name)`` picks one from :data:`BACKENDS`, and
:func:`register_backend` adds more.

``cpu`` (checked against real CPU autograd in the tests, torch 2.13):

* dropout saves a mask in the input's dtype (``input * bernoulli(1-p) / (1-p)``: the scaled
  noise tensor, 4 bytes per element in float32);
* ``scaled_dot_product_attention`` runs CPU flash attention when it can (saves q, k, v, the
  output and a float32 log-sum-exp of ``batch * heads * seq``) and the math path otherwise
  (with dropout: probabilities, mask and their product);
* ``nn.LSTM`` runs oneDNN's ``mkldnn_rnn_layer``, which saves a byte workspace whose size
  :func:`onednn_lstm_workspace` computes (fake kernels report an empty one);
* BatchNorm keeps float32 mean and inverse std for half inputs with float32 weights (as
  under autocast); LayerNorm and all-half BatchNorm keep the input's dtype.

``cuda`` (Ampere or newer, PyTorch's rules; checked on an H200 by ``benchmarks/bench_gpu.py``):

* dropout is ``native_dropout`` and saves a 1-byte bool mask;
* ``scaled_dot_product_attention`` runs flash attention (fp16/bf16, no mask, head dim <= 256;
  grouped key/value heads read in place) or memory-efficient attention (fp32 too, masks, head
  dim a multiple of 8, as many key/value heads as query heads), which save q, k, v, the output
  and a float32 log-sum-exp instead of the probabilities; else the math path
  (``_scaled_dot_product_attention_math``: the probabilities saved, grouped key/value heads
  repeated), not CPU's flash kernel;
* LayerNorm and BatchNorm keep float32 mean and inverse std for half inputs;
* recurrent layers run PyTorch's generic cell loop (cuDNN's reserve space is not modelled);
* ``autocast`` follows CUDA's op lists (:mod:`memflow.graph.autocast`).

The function rules apply to calls a model makes itself (``nn`` modules, ``torch.nn.functional``),
not to calls PyTorch makes inside another Python function of ``torch.nn.functional``.

>>> sorted(BACKENDS)
['cpu', 'cuda']
>>> get_backend("tpu")
Traceback (most recent call last):
...
memflow.errors.CaptureError: backend='tpu' is unknown; valid: 'cpu', 'cuda'
>>> onednn_lstm_workspace(steps=5, batch=3, input_size=8, hidden=16)
28672
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Mapping

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from ..errors import CaptureError
from .autocast import CudaAutocast, cpu_autocast

__all__ = ["Backend", "BACKENDS", "get_backend", "register_backend", "onednn_lstm_workspace",
           "cuda_sdpa_kernel", "RuleMode"]

aten = torch.ops.aten

FunctionRule = Callable[[Callable, tuple, dict], Any]
OutputRule = Callable[[tuple, dict, Any], Any]


@dataclass(frozen=True)
class Backend:
    """A device's rules for capture.

    ``functions`` replace torch functions (``F.dropout``…) by what the device runs;
    ``outputs`` fix the results of aten ops whose fake kernels do not know the device's sizes;
    ``mkldnn`` keeps oneDNN kernels on (the CPU's LSTM); ``cuda_autocast`` applies CUDA's
    autocast lists instead of the CPU's.
    """

    name: str
    description: str
    functions: Mapping[Callable, FunctionRule] = field(default_factory=dict)
    outputs: Mapping[Any, OutputRule] = field(default_factory=dict)
    mkldnn: bool = True
    cuda_autocast: bool = False

    def context(self, autocast: torch.dtype | None) -> ContextManager:
        """Everything the backend switches on while the model runs."""
        stack = contextlib.ExitStack()
        if not self.mkldnn:
            stack.enter_context(_mkldnn_off())
        policy = CudaAutocast(autocast) if (self.cuda_autocast and autocast) else None
        if not self.cuda_autocast:
            stack.enter_context(cpu_autocast(autocast))
        if self.functions or policy is not None:
            stack.enter_context(RuleMode(self.functions, policy))
        return stack

    def fix_output(self, func: Any, args: tuple, kwargs: dict, out: Any) -> Any:
        """``out`` with the backend's output rule for ``func`` applied (if any)."""
        rule = self.outputs.get(func.overloadpacket) if self.outputs else None
        return out if rule is None else rule(args, kwargs, out)


@contextlib.contextmanager
def _mkldnn_off():
    # torch.backends.mkldnn.flags() would also reset (and warn about) its TF32 setting.
    was = torch._C._get_mkldnn_enabled()
    torch._C._set_mkldnn_enabled(False)
    try:
        yield
    finally:
        torch._C._set_mkldnn_enabled(was)


class RuleMode(TorchFunctionMode):
    """Applies function rules and an autocast policy to the torch functions a model calls."""

    def __init__(self, rules: Mapping[Callable, FunctionRule], policy: CudaAutocast | None):
        super().__init__()
        self.rules = rules
        self.policy = policy

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.policy is not None:
            cast = self.policy.cast(getattr(func, "__name__", ""), args, kwargs)
            if cast is not None:
                args, kwargs = cast
        rule = self.rules.get(func)
        if rule is not None:
            return rule(func, args, kwargs)
        return func(*args, **kwargs)


# ---------------------------------------------------------------------------- output rules

def _float32_stats(args: tuple, kwargs: dict, out: Any) -> Any:
    # CUDA keeps a normalization's saved mean and inverse std in float32 (the accumulation
    # type) for half inputs; the fake kernels keep the input's dtype.
    stats = out[1:3]
    if stats[0].dtype not in (torch.float16, torch.bfloat16):
        return out
    return (out[0], *(torch.empty(t.shape, dtype=torch.float32, device=t.device)
                      for t in stats), *out[3:])


def _cpu_batch_norm_stats(args: tuple, kwargs: dict, out: Any) -> Any:
    # The CPU kernel does so only for mixed precision: half input, float32 weight.
    weight = args[1] if len(args) > 1 else kwargs.get("weight")
    if weight is None or weight.dtype != torch.float32:
        return out
    return _float32_stats(args, kwargs, out)


def _good_ld(dim: int, itemsize: int) -> int:
    # oneDNN pads leading dimensions to 64 bytes, and away from multiples of 256 elements.
    per_line = 64 // itemsize
    ld = -(-dim // per_line) * per_line
    return ld + per_line if ld % 256 == 0 else ld


def onednn_lstm_workspace(steps: int, batch: int, input_size: int, hidden: int,
                          itemsize: int = 4) -> int:
    """Bytes of the workspace oneDNN's LSTM keeps for backward (one layer, one direction).

    It follows oneDNN's ``rnn_utils``: gates, hidden states, layer and cell states, and two
    float32 difference-state buffers, each starting on a 4 KiB page. ``itemsize`` is 4 for
    float32 and 2 for bfloat16 (difference states stay float32).
    """
    page = 4096
    states_ld = max(input_size, hidden)
    parts = [
        steps * batch * _good_ld(4 * hidden, itemsize) * itemsize,        # gates
        steps * batch * _good_ld(hidden, itemsize) * itemsize,            # hidden outputs
        2 * (steps + 1) * batch * _good_ld(states_ld, itemsize) * itemsize,   # states
        2 * (steps + 1) * batch * hidden * itemsize,                      # cell states
        2 * (steps + 1) * batch * _good_ld(states_ld, 4) * 4,             # diff layer states
        2 * (steps + 1) * batch * _good_ld(states_ld, 4) * 4,             # diff iter states
        2 * (steps + 1) * batch * hidden * 4,                             # diff cell states
    ]
    offset = 0
    for size in parts:
        offset = -(-offset // page) * page + size
    return -(-offset // page) * page


def _mkldnn_workspace(args: tuple, kwargs: dict, out: Any) -> Any:
    # PyTorch hands each layer its input time-major, (steps, batch, features), whatever
    # the module's batch_first says.
    x, hidden = args[0], args[10]
    size = onednn_lstm_workspace(x.shape[0], x.shape[1], x.shape[2], hidden, x.element_size())
    workspace = torch.empty(size, dtype=out[3].dtype, device=out[3].device)
    return (*out[:3], workspace)


# ---------------------------------------------------------------------------- function rules

def _arg(args: tuple, kwargs: dict, index: int, name: str, default: Any) -> Any:
    return args[index] if len(args) > index else kwargs.get(name, default)


def _cuda_dropout(func: Callable, args: tuple, kwargs: dict) -> Any:
    x = args[0] if args else kwargs["input"]
    p = _arg(args, kwargs, 1, "p", 0.5)
    training = _arg(args, kwargs, 2, "training", True)
    inplace = _arg(args, kwargs, 3, "inplace", False)
    # CUDA fuses dropout (native_dropout, bool mask) except in place or at p in {0, 1}.
    if not training or inplace or not 0 < p < 1:
        return func(*args, **kwargs)
    return torch.native_dropout(x, p, True)[0]


def cuda_sdpa_kernel(query: torch.Tensor, key: torch.Tensor, attn_mask: Any,
                     enable_gqa: bool = False) -> str:
    """The kernel CUDA's ``scaled_dot_product_attention`` picks: flash, efficient or math.

    >>> q = torch.empty(2, 4, 16, 64, dtype=torch.float16, device="meta")
    >>> cuda_sdpa_kernel(q, q, None), cuda_sdpa_kernel(q.float(), q.float(), None)
    ('flash', 'efficient')
    """
    head_dim = query.shape[-1]
    if query.dim() != 4:
        return "math"
    half = query.dtype in (torch.float16, torch.bfloat16)
    # Flash reads grouped key/value heads in place (sdp_utils: "supports GQA"); efficient
    # attention needs as many key/value heads as query heads, so grouped heads fall to math.
    if half and attn_mask is None and head_dim <= 256:
        return "flash"
    grouped = enable_gqa and query.shape[1] != key.shape[1]
    if not grouped and (half or query.dtype == torch.float32) and head_dim % 8 == 0:
        return "efficient"
    return "math"


def _efficient_bias(mask: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    # As attention.cu: bool masks become additive float masks; the bias is expanded to
    # (batch, heads, q, k) and its last dimension padded to a multiple of 16.
    if mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(
            mask.logical_not(), float("-inf"))
    bias = mask.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    extra = -bias.shape[-1] % 16
    if extra:
        bias = F.pad(bias, (0, extra))[..., :k.shape[2]]
    return bias


def _cuda_sdpa(func: Callable, args: tuple, kwargs: dict) -> Any:
    q, k, v = args[:3] if len(args) >= 3 else (kwargs["query"], kwargs["key"], kwargs["value"])
    mask = _arg(args, kwargs, 3, "attn_mask", None)
    dropout_p = _arg(args, kwargs, 4, "dropout_p", 0.0)
    causal = _arg(args, kwargs, 5, "is_causal", False)
    scale = kwargs.get("scale", args[6] if len(args) > 6 else None)
    gqa = kwargs.get("enable_gqa", False)
    kernel = cuda_sdpa_kernel(q, k, mask, gqa)
    if kernel == "flash":
        head_dim = q.shape[-1]
        scale = scale if scale is not None else head_dim ** -0.5
        pad = -head_dim % 8           # flash pads the head dimension to a multiple of 8
        if pad:
            q, k, v = (F.pad(t, (0, pad)) for t in (q, k, v))
        out = aten._scaled_dot_product_flash_attention(q, k, v, dropout_p, causal, False,
                                                        scale=scale)[0]
        return out[..., :head_dim] if pad else out
    if kernel == "efficient":
        bias = None if mask is None else _efficient_bias(mask, q, k)
        lse = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
        return aten._scaled_dot_product_efficient_attention(q, k, v, bias, lse, dropout_p,
                                                            causal, scale=scale)[0]
    # CUDA's math path, spelled out: the fake tensors are CPU ones, and CPU's dispatcher would
    # pick its own flash kernel (q, k, v and a log-sum-exp saved) where CUDA materialises the
    # probabilities (and grouped key/value heads repeated), seen on an H200 (torch 2.11): a
    # fp32 grouped-query Llama held 13 GB more than the CPU kernel's capture predicted
    return aten._scaled_dot_product_attention_math(q, k, v, mask, dropout_p, causal, None,
                                                   scale=scale, enable_gqa=gqa)[0]


BACKENDS: dict[str, Backend] = {}


def register_backend(backend: Backend) -> Backend:
    """Add (or replace) a backend under ``backend.name``; returns it."""
    if not isinstance(backend, Backend):
        raise CaptureError(f"register_backend needs a Backend, got {type(backend).__name__}")
    BACKENDS[backend.name] = backend
    return backend


def get_backend(name: str | Backend) -> Backend:
    """The backend named ``name`` (a :class:`Backend` is returned as is)."""
    if isinstance(name, Backend):
        return name
    try:
        return BACKENDS[name]
    except (KeyError, TypeError):
        valid = ", ".join(repr(b) for b in sorted(BACKENDS))
        raise CaptureError(f"backend={name!r} is unknown; valid: {valid}") from None


register_backend(Backend(
    "cpu", "PyTorch on CPU: dropout saves an input-dtype mask, CPU flash attention, oneDNN LSTM",
    outputs={aten.mkldnn_rnn_layer: _mkldnn_workspace,
             aten.native_batch_norm: _cpu_batch_norm_stats}))
register_backend(Backend(
    "cuda", "PyTorch on CUDA (Ampere+): 1-byte dropout masks, flash/efficient attention, "
    "CUDA autocast lists",
    functions={F.dropout: _cuda_dropout, F.scaled_dot_product_attention: _cuda_sdpa},
    outputs={aten.native_layer_norm: _float32_stats, aten.native_batch_norm: _float32_stats},
    mkldnn=False, cuda_autocast=True))
