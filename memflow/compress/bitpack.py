"""Integer codes of ``bits`` bits packed into bit planes, with torch ops (so on GPU too).

Plane ``j`` holds bit ``j`` of every code, eight codes per byte, so ``n`` codes of ``bits``
bits take ``bits · ceil(n / 8)`` bytes: the minimum for a fixed width, whatever the width
(no code straddles a machine word). Planes also suit a lossless stage: the high planes of
small-valued codes are mostly zero bytes, which zlib squeezes well.

>>> import torch
>>> codes = torch.tensor([5, 0, 7, 2, 1, 6, 3, 4, 7], dtype=torch.int32)
>>> planes = pack_bits(codes, 3)
>>> tuple(planes.shape), planes.dtype
((3, 2), torch.uint8)
>>> unpack_bits(planes, 3, 9).tolist()
[5, 0, 7, 2, 1, 6, 3, 4, 7]
"""
from __future__ import annotations

import torch

__all__ = ["pack_bits", "unpack_bits", "packed_size"]


# A multiply trick on 64-bit words of 8 code bytes (Warren, "Hacker's Delight", 7-2): keeping
# bit j of each byte (positions 8i+j) and multiplying by GATHER >> j moves byte i's bit to
# position 56+i with no collisions or carries, so one multiply packs bit j of 8 codes into the
# top byte. Products wrap modulo 2**64, which is what the trick relies on.
_LOW_BITS = 0x0101010101010101
_GATHER = 0x0102040810204080


def _signed(value: int) -> int:
    """A 64-bit pattern as the int64 torch takes it."""
    return value - (1 << 64) if value >= 1 << 63 else value


def packed_size(n: int, bits: int) -> int:
    """Bytes that :func:`pack_bits` uses for ``n`` codes of ``bits`` bits.

    >>> packed_size(1000, 3)
    375
    """
    return bits * ((n + 7) // 8)


def _code_bytes(codes: torch.Tensor, bits: int) -> list[torch.Tensor]:
    """Codes split into uint8 tensors of 8 bits each (low byte first), padded to 8k codes."""
    n = codes.numel()
    pad = (-n) % 8
    if pad:
        codes = torch.cat([codes, codes.new_zeros(pad)])
    if bits <= 8:
        return [codes.to(torch.uint8)]
    return [torch.bitwise_and(codes >> (8 * m), 0xFF).to(torch.uint8)
            for m in range((bits + 7) // 8)]


def pack_bits(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack non-negative int codes (< 2**bits, 1-D) into a ``(bits, ceil(n/8))`` uint8 tensor."""
    parts = _code_bytes(codes, bits)
    out = torch.empty((bits, parts[0].numel() // 8), dtype=torch.uint8, device=codes.device)
    for j in range(bits):
        k = j % 8
        word = torch.bitwise_and(parts[j // 8].view(torch.int64), _signed(_LOW_BITS << k))
        word.mul_(_GATHER >> k)
        word >>= 56
        out[j].copy_(word)  # the int64 -> uint8 cast keeps the low byte: the packed bits
    return out


_TABLES: dict[torch.device, torch.Tensor] = {}


def _bit_tables(device: torch.device) -> torch.Tensor:
    """(8, 256, 8) uint8: table[j][v] holds bit i of byte v, shifted to position j, in byte i."""
    if device not in _TABLES:
        v = torch.arange(256, dtype=torch.uint8).unsqueeze(1)
        bits = torch.bitwise_and(v >> torch.arange(8, dtype=torch.uint8), 1)
        _TABLES[device] = torch.stack([bits << j for j in range(8)]).to(device)
    return _TABLES[device]


def unpack_bits(planes: torch.Tensor, bits: int, n: int,
                dtype: torch.dtype | None = None) -> torch.Tensor:
    """Inverse of :func:`pack_bits`: the first ``n`` codes, as uint8 (``bits <= 8``) or int32,
    or as ``dtype`` (a float: codes below 2**24 are exact in float32).

    Each plane byte expands to 8 code bytes through a 256-entry table (one gather), which
    moves less memory than shifting and masking each bit out. A float ``dtype`` sums the code
    bytes into the result itself: no integer codes beside it (decompression's scratch).

    >>> unpack_bits(pack_bits(torch.tensor([700, 3], dtype=torch.int32), 10), 10, 2,
    ...             torch.float32).tolist()
    [700.0, 3.0]
    """
    words = (n + 7) // 8
    tables = _bit_tables(planes.device)
    parts = []
    for m in range(0, bits, 8):  # one byte of every code at a time
        part = torch.zeros(words * 8, dtype=torch.uint8, device=planes.device)
        for j in range(m, min(bits, m + 8)):
            part.add_(tables[j - m][planes[j].long()].view(-1))  # disjoint bits: add == or
        parts.append(part)
    if not parts:
        return torch.zeros(n, dtype=dtype or torch.uint8, device=planes.device)
    if dtype is not None and dtype.is_floating_point:
        codes = parts[0][:n].to(dtype)
        for m, part in enumerate(parts[1:], start=1):
            codes.add_(part[:n], alpha=256 ** m)
        return codes
    if len(parts) == 1:
        return parts[0][:n]
    codes = parts[0].to(torch.int32)
    for m, part in enumerate(parts[1:], start=1):
        codes |= part.to(torch.int32) << (8 * m)
    return codes[:n]
