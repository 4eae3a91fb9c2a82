"""memflow's error-bounded lossy compressor of feature maps (COMET-style, SZ's bound).

``compress(x, eb)`` guarantees ``|x - decompress(compress(x, eb))| <= eb`` for every element.
Uniform scalar quantization on a grid of ``step = 2·eb`` (a hair less, so float rounding rarely
matters): ``x ≈ (q + offset)·step`` when the values span zero, so that zero is a grid point and
comes back exactly (a ReLU's backward tests ``output > 0``), else ``x ≈ min + q·step``; codes bit-packed at the minimum width
(:mod:`~memflow.compress.bitpack`), all in torch ops on the tensor's own device. The bound is
then *checked* element by element on the reconstruction in the tensor's dtype (a float32
difference against a threshold a hair under the bound, which rounding cannot fool);
any element that misses it (float rounding, or a 16-bit dtype too coarse to land within eb) is
stored exactly as an outlier, as are NaN and ±inf. So the guarantee holds by construction,
not by argument. ``relative=True`` means ``eb · (max - min)`` over the finite values (SZ's
REL mode). An optional lossless stage (zlib level 1, on CPU) squeezes the bit planes further.

When the codes would need 24 bits or more (float32 integers stop being exact there), as many
bits as the dtype itself, or the packed form would not be smaller (a handful of elements), the
tensor is kept raw: compression would not pay.

>>> import torch
>>> x = torch.linspace(-1, 1, 1000)
>>> p = compress(x, 1e-2)
>>> p.bits, round(p.ratio, 2), bool((decompress(p) - x).abs().max() <= 1e-2)
(7, 4.41, True)
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import CompressionError
from .bitpack import pack_bits, packed_size, unpack_bits

__all__ = ["Packed", "compress", "decompress", "compressed_bytes", "FLOAT_DTYPES"]

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_MAX_CODE_BITS = {torch.float32: 23, torch.float64: 31}  # codes stay exact in the working
                                                          # float and fit an int32
STEP_MARGIN = 1 - 2 ** -12          # step a hair under 2·eb: float rounding stays inside eb
HEADER_BYTES = 32                   # min, step, bits, count, shape: a fixed small header


@dataclass(eq=False)
class Packed:
    """A compressed tensor: what :func:`decompress` needs and what memory it really holds.

    ``planes`` (uint8, ``bits × ceil(n/8)``) stay on the tensor's device unless the lossless
    stage moved them to CPU bytes (``zipped``). ``outlier_index``/``outlier_value`` restore
    elements kept exactly. ``raw`` holds an uncompressed copy when compression would not pay.
    """

    shape: torch.Size
    dtype: torch.dtype
    device: torch.device
    error_bound: float               # absolute bound honoured element-wise
    base: float = 0.0                # x ≈ (code + offset) · step + base
    offset: int = 0
    step: float = 0.0
    bits: int = 0
    planes: torch.Tensor | None = None
    zipped: bytes | None = None
    outlier_index: torch.Tensor | None = None
    outlier_value: torch.Tensor | None = None
    raw: torch.Tensor | None = None
    compressor: str = "quantizer"    # what made it: "quantizer", or "sz3" (memflow.compress.sz3)
    stream: torch.Tensor | None = None   # SZ3's bytes (uint8, CPU)
    shift: float = 0.0               # SZ3 on a map >= 0 with zeros: positives were moved up by
                                     # this so that zeros stay zeros (see sz3.py)

    @property
    def numel(self) -> int:
        """Elements of the original tensor."""
        return math.prod(self.shape)

    @property
    def original_bytes(self) -> int:
        """Bytes of the original tensor."""
        return self.numel * self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        """Bytes this object holds (see :func:`compressed_bytes`)."""
        return compressed_bytes(self)

    @property
    def ratio(self) -> float:
        """Original bytes / compressed bytes."""
        return self.original_bytes / max(1, self.nbytes)

    @property
    def outliers(self) -> int:
        """Elements stored exactly (bound missed by rounding, NaN, inf)."""
        return 0 if self.outlier_index is None else int(self.outlier_index.numel())


def compressed_bytes(packed: Packed) -> int:
    """Bytes a packed tensor occupies: planes (or zlib bytes, or SZ3's stream), outliers and a
    small header.

    >>> compressed_bytes(compress(torch.zeros(1000), 0.1))
    32
    """
    if packed.raw is not None:
        return packed.original_bytes
    body = sum(0 if b is None else (len(b) if isinstance(b, bytes) else b.numel())
               for b in (packed.zipped, packed.planes, packed.stream))
    extra = 0
    if packed.outlier_index is not None:
        extra = packed.outlier_index.numel() * packed.outlier_index.element_size() + \
            packed.outlier_value.numel() * packed.outlier_value.element_size()
    return HEADER_BYTES + body + extra


def check_args(tensor: torch.Tensor, error_bound: float) -> float:
    if not isinstance(tensor, torch.Tensor):
        raise CompressionError(f"compress expects a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype not in FLOAT_DTYPES:
        raise CompressionError(f"compress: dtype {tensor.dtype} is not supported; floating tensors "
                           f"only ({', '.join(str(d) for d in FLOAT_DTYPES)})")
    if tensor.layout != torch.strided or tensor.device.type == "meta":
        raise CompressionError("compress: only dense tensors with data can be compressed "
                           f"(got layout {tensor.layout} on {tensor.device})")
    try:
        eb = float(error_bound)
    except (TypeError, ValueError):
        raise CompressionError(f"error_bound must be a number, got {error_bound!r}") from None
    if not (eb > 0 and math.isfinite(eb)):
        raise CompressionError(f"error_bound must be a finite number > 0, got {error_bound!r}")
    return eb


def finite_range(values: torch.Tensor) -> tuple[float, float, torch.Tensor | None]:
    """``(min, max)`` over the finite elements of a flat tensor, and their mask (None when
    every element is finite, the common case, found without making one)."""
    low, high = (float(v) for v in torch.aminmax(values)) if values.numel() else (0.0, 0.0)
    # min and max propagate NaN and show inf: finite extremes mean every element is finite
    if math.isfinite(low) and math.isfinite(high):
        return low, high, None
    finite = torch.isfinite(values)     # rare: range over the finite values only
    if not bool(finite.any()):
        return 0.0, 0.0, finite
    return (float(torch.where(finite, values, math.inf).min()),
            float(torch.where(finite, values, -math.inf).max()), finite)


def _reconstruct(codes: torch.Tensor, packed: Packed, work: torch.dtype,
                 inplace: bool = False) -> torch.Tensor:
    """Values in the working float. The same ops run in compress (to check the bound) and in
    decompress (to rebuild), so both see the same numbers."""
    out = codes if inplace and codes.dtype == work else codes.to(work)
    if packed.offset:
        out.add_(packed.offset)     # integers below 2**24: exact in float32
    out.mul_(packed.step)
    return out.add_(packed.base) if packed.base else out


def threshold(bound: float, work: torch.dtype) -> float:
    """A working-float number just under ``bound``: a difference computed in ``work`` (relative
    rounding error <= eps/2) that does not exceed it is truly within ``bound``."""
    eps = torch.finfo(work).eps
    target = bound * (1 - 2 * eps)
    if work == torch.float32:  # round down to a float32, so the comparison is exact
        t = np.float32(target)
        return float(t if t <= target else np.nextafter(t, np.float32(0)))
    return target


def grid_step(low: float, high: float, bound: float, dtype: torch.dtype) -> float:
    # Leave room for the final cast to a 16-bit dtype (rounding up to half an ulp of the
    # largest value) unless that ulp is comparable to the bound itself.
    cast = max(abs(low), abs(high)) * torch.finfo(dtype).eps / 2
    half = bound * STEP_MARGIN - cast
    return 2 * (half if half > bound / 2 else bound * STEP_MARGIN)


def compress(tensor: torch.Tensor, error_bound: float, *, relative: bool = False,
             lossless: bool = False) -> Packed:
    """Compress ``tensor`` so that every element comes back within ``error_bound``.

    ``relative``: the bound is ``error_bound · (max - min)`` of the finite values.
    ``lossless``: zlib the bit planes (on CPU) too. Raises
    :class:`~memflow.errors.CompressionError` for a non-positive bound or a non-float tensor.

    >>> x = torch.tensor([0.0, 1.0, float("nan"), 2.5], dtype=torch.float16)
    >>> y = decompress(compress(x, 0.3))
    >>> y.dtype, y[2].isnan().item(), (y - x).abs().nan_to_num().max().item() <= 0.3
    (torch.float16, True, True)
    """
    eb = check_args(tensor, error_bound)
    x = tensor.detach()
    flat = x.reshape(-1)
    n = flat.numel()
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    values = flat.to(work)
    low, high, finite = finite_range(values)
    all_finite = finite is None
    bound = eb * (high - low) if relative else eb
    packed = Packed(x.shape, x.dtype, x.device, bound, base=low)
    if high == low:  # constant (or empty): every finite element is `low`; no codes at all
        codes = torch.zeros(n, dtype=torch.int32, device=x.device)
    else:
        step = grid_step(low, high, bound, x.dtype)
        levels = (high - low) / step + 2
        limit = min(_MAX_CODE_BITS[work], x.dtype.itemsize * 8 - 1)
        if not levels < 2.0 ** limit or \
                packed_size(n, math.ceil(math.log2(levels))) + HEADER_BYTES >= n * x.itemsize:
            packed.raw = x.clone()  # too many bits (or an overflow to inf), or too few elements
            return packed
        packed.step = step
        if low <= 0 <= high:  # anchor the grid at zero: round(v/step) - round(low/step) >= 0
            packed.base = 0.0
            packed.offset = int(torch.round(torch.tensor(low, dtype=work) / step))
            q = torch.div(values, step).round_()
            if packed.offset:
                q.sub_(packed.offset)
        else:                 # v - low >= 0 exactly, so codes start at 0
            q = torch.sub(values, low).div_(step).round_()
        if not all_finite:
            q.nan_to_num_(0.0, 0.0, 0.0)
        packed.bits = int(q.max()).bit_length()
        codes = q.to(torch.int32)
    # rebuild in place on the float codes: the same values decompress gets from int codes
    recon = _reconstruct(codes if packed.bits == 0 else q, packed, work, inplace=True)
    if x.dtype != work:
        recon = recon.to(x.dtype).to(work)
    miss = recon.sub_(values).abs_() > threshold(bound, work)  # NaN compares False:
    if not all_finite:
        miss |= ~finite                                          # count them in
    keep_outliers(packed, flat, miss)
    if packed.bits:
        planes = pack_bits(codes, packed.bits)
        if lossless:
            packed.zipped = zlib.compress(planes.cpu().numpy().tobytes(), 1)
        else:
            packed.planes = planes
    return packed


def keep_outliers(packed: Packed, flat: torch.Tensor, miss: torch.Tensor) -> None:
    """Store the elements of ``flat`` where ``miss`` is true exactly, beside the codes."""
    if bool(miss.any()):
        index = torch.nonzero(miss).flatten()
        packed.outlier_index = index.to(torch.int32 if flat.numel() < 2 ** 31 else torch.int64)
        packed.outlier_value = flat[index].clone()


def decompress(packed: Packed) -> torch.Tensor:
    """The tensor back: same shape, dtype and device; every element within the bound.

    >>> x = torch.randn(3, 5, dtype=torch.bfloat16)
    >>> y = decompress(compress(x, 0.05))
    >>> y.shape, y.dtype, bool(((y.float() - x.float()).abs() <= 0.05).all())
    (torch.Size([3, 5]), torch.bfloat16, True)
    """
    if packed.compressor != "quantizer":
        raise CompressionError(f"this tensor was packed by {packed.compressor!r}: decompress it "
                               "with memflow.compress.decompress")
    if packed.raw is not None:
        return packed.raw
    n = packed.numel
    work = torch.float64 if packed.dtype == torch.float64 else torch.float32
    if packed.bits == 0:
        codes = torch.zeros(n, dtype=torch.uint8, device=packed.device)
    else:
        planes = packed.planes
        if packed.zipped is not None:
            buf = bytearray(zlib.decompress(packed.zipped))
            planes = torch.frombuffer(buf, dtype=torch.uint8).view(packed.bits, -1)
            planes = planes.to(packed.device)
        # as floats, rebuilt in place: one map's bytes (integer codes beside them, then
        # their float copy, held 3.8 maps at a node's backward where one is charged)
        codes = unpack_bits(planes, packed.bits, n, work)
    out = _reconstruct(codes, packed, work, inplace=True).to(packed.dtype)
    if packed.outlier_index is not None:
        out[packed.outlier_index.long()] = packed.outlier_value
    return out.view(packed.shape)
