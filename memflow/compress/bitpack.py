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


# Multiply tricks on 64-bit words of 8 code bytes (Warren, "Hacker's Delight", 7-2):
# GATHER moves bit 8i of a word to bit 56+i, so one multiply packs bit j of 8 codes into a
# byte; SPREAD copies a byte into all 8 bytes and MASK keeps bit i in byte i, the inverse.
# Products wrap modulo 2**64, which is what these tricks rely on.
_LOW_BITS = 0x0101010101010101
_GATHER = 0x0102040810204080
_SPREAD = 0x0101010101010101
_MASK = 0x8040201008040201 - 2 ** 64   # as a signed int64
_ROUND_UP = 0x7F7F7F7F7F7F7F7F


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
    words = parts[0].numel() // 8
    out = torch.empty((bits, words), dtype=torch.uint8, device=codes.device)
    for j in range(bits):
        w = parts[j // 8].view(torch.int64)
        gathered = torch.bitwise_and(w >> (j % 8), _LOW_BITS).mul_(_GATHER) >> 56
        out[j] = torch.bitwise_and(gathered, 0xFF).to(torch.uint8)
    return out


def unpack_bits(planes: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """Inverse of :func:`pack_bits`: the first ``n`` codes, as int32."""
    words = (n + 7) // 8
    codes = torch.zeros(words * 8, dtype=torch.int32, device=planes.device)
    for m in range(0, bits, 8):  # one byte of every code at a time, in uint8
        part = torch.zeros(words * 8, dtype=torch.uint8, device=planes.device)
        for j in range(m, min(bits, m + 8)):
            spread = planes[j].to(torch.int64).mul_(_SPREAD)
            bit = torch.bitwise_and(spread, _MASK).add_(_ROUND_UP) >> 7
            part |= torch.bitwise_and(bit, _LOW_BITS).view(torch.uint8) << (j - m)
        codes |= part.to(torch.int32) << m
    return codes[:n]
