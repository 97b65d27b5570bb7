"""Dense bit packing of b-bit integers into int32 words: the compressed-tensors layout.

Along the packed dimension, element i of a row occupies bits [i*b, (i+1)*b) of that
row's bit stream; bit k of the stream is bit k % 32 of word k // 32. Values are stored
unsigned, offset by 2^(b-1). For b = 4 this is eight nibbles per word, element 0 in the
lowest nibble; for b = 3 an element may straddle two words. A row of n elements takes
ceil(n*b/32) words. Weights pack along the input dimension (dim 1), zero points along
the output dimension (dim 0).

    b=4, one word:  bits 31..28 27..24 ... 7..4 3..0
                    elem  7      6     ...  1    0
"""

from __future__ import annotations

import math
import sys

import torch

_WORD = 32


ROWS = 4096  # rows packed at a time: the int64 work is 8x the int8 values it holds


def pack(values: torch.Tensor, bits: int, dim: int = 1) -> torch.Tensor:
    """Pack a 2-D int8 tensor of signed b-bit values into int32 words along `dim`, a slice
    of rows at a time along dim 1 (a 152k-row head whole took 10 GB of int64 work)."""
    if dim == 1 and bits in (4, 8) and sys.byteorder == "little" and values.dim() == 2:
        return _pack_bytes(values, bits)
    if dim == 1 and values.shape[0] > ROWS:
        rows, cols = values.shape
        out = torch.empty(rows, math.ceil(cols * bits / _WORD), dtype=torch.int32)
        for lo in range(0, rows, ROWS):
            out[lo : lo + ROWS] = _pack(values[lo : lo + ROWS], bits, 1)
        return out
    return _pack(values, bits, dim)


def _pack_bytes(values: torch.Tensor, bits: int) -> torch.Tensor:
    """4 and 8 bits along rows, the inverse of _unpack_bytes: each byte of a little-endian
    word takes two nibbles (the lower element in the low nibble) or one offset byte, so
    no int64 word is built (the general path took 3.6 s a block of a 7B-shaped model, the
    most of `compress --quant rtn` after the rounding). ROWS rows at a time, in uint8."""
    rows, cols = values.shape
    words = math.ceil(cols * bits / _WORD)
    out = torch.zeros(rows, words * 4, dtype=torch.uint8, device=values.device)  # padding: 0
    for lo in range(0, rows, ROWS):
        part = values[lo : lo + ROWS].view(torch.uint8)
        dest = out[lo : lo + ROWS]
        if bits == 8:  # v + 128 is v's two's complement with the top bit flipped
            torch.bitwise_xor(part, 128, out=dest[:, :cols])
            continue
        biased = torch.add(part, 8)  # v + 8 in 0..15 (uint8 wraps as two's complement)
        low, high = biased[:, 0::2], biased[:, 1::2]
        half = high.shape[1]
        dest[:, :half].copy_(low[:, :half]).bitwise_or_(high.bitwise_left_shift(4))
        if low.shape[1] > half:  # an odd width: a row's last element alone in its byte
            dest[:, half] = low[:, half]
    return out.view(torch.int32)


def _pack(values: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    v = values.to(torch.int64) + (1 << (bits - 1))
    if dim == 0:
        v = v.T
    rows, cols = v.shape
    chunks = math.ceil(cols / _WORD)
    v = torch.nn.functional.pad(v, (0, chunks * _WORD - cols)).reshape(rows, chunks, _WORD)
    words = torch.zeros(rows, chunks, bits, dtype=torch.int64)
    for e in range(_WORD):  # 32 vectorized steps, one per element position in a chunk
        word, offset = divmod(e * bits, _WORD)
        words[:, :, word] |= v[:, :, e] << offset
        spill = offset + bits - _WORD
        if spill > 0:
            words[:, :, word + 1] |= v[:, :, e] >> (bits - spill)
    words = (words & 0xFFFFFFFF).reshape(rows, chunks * bits)[:, : math.ceil(cols * bits / _WORD)]
    packed = torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)
    return packed.T.contiguous() if dim == 0 else packed.contiguous()


def unpack(packed: torch.Tensor, bits: int, shape: tuple[int, int], dim: int = 1) -> torch.Tensor:
    """Inverse of `pack`: int32 words back to int8 values of the given 2-D shape."""
    if dim == 1 and bits in (4, 8) and sys.byteorder == "little" and packed.dim() == 2:
        return _unpack_bytes(packed, bits, shape)
    if dim == 1 and shape[0] > ROWS:
        out = torch.empty(shape, dtype=torch.int8)
        for lo in range(0, shape[0], ROWS):
            part = packed[lo : lo + ROWS]
            out[lo : lo + ROWS] = _unpack(part, bits, (part.shape[0], shape[1]), 1)
        return out
    return _unpack(packed, bits, shape, dim)


def _unpack_bytes(packed: torch.Tensor, bits: int, shape: tuple[int, int]) -> torch.Tensor:
    """4 and 8 bits along rows: a little-endian word's bytes hold its elements in order
    (two nibbles a byte, the lower first), so the words read as bytes unpack without the
    general path's per-position shifts of int64 words (10x the time at a 7B layer). ROWS
    rows at a time, in uint8 and int8 only: a 152k-word head's transients stay small."""
    rows, cols = shape
    b = packed.contiguous().view(torch.uint8)
    out = torch.empty(shape, dtype=torch.int8)
    for lo in range(0, rows, ROWS):
        part = b[lo : lo + ROWS]
        if bits == 8:  # stored v + 128: flipping the top bit gives v's two's complement
            out[lo : lo + ROWS] = torch.bitwise_xor(part[:, :cols], 128).view(torch.int8)
            continue
        nibbles = torch.empty(part.shape[0], part.shape[1], 2, dtype=torch.uint8)
        torch.bitwise_and(part, 15, out=nibbles[..., 0])
        torch.bitwise_right_shift(part, 4, out=nibbles[..., 1])
        signed = nibbles.view(torch.int8).sub_(8)  # stored v + 8, 0..15
        out[lo : lo + ROWS] = signed.view(part.shape[0], -1)[:, :cols]
    return out


def _unpack(packed: torch.Tensor, bits: int, shape: tuple[int, int], dim: int) -> torch.Tensor:
    w = packed.to(torch.int64) & 0xFFFFFFFF
    if dim == 0:
        w = w.T
        shape = (shape[1], shape[0])
    rows, cols = shape
    chunks = math.ceil(cols / _WORD)
    w = torch.nn.functional.pad(w, (0, chunks * bits - w.shape[1])).reshape(rows, chunks, bits)
    mask = (1 << bits) - 1
    out = torch.empty(rows, chunks, _WORD, dtype=torch.int64)
    for e in range(_WORD):
        word, offset = divmod(e * bits, _WORD)
        value = w[:, :, word] >> offset
        spill = offset + bits - _WORD
        if spill > 0:
            value = value | (w[:, :, word + 1] << (bits - spill))
        out[:, :, e] = value & mask
    values = (out.reshape(rows, chunks * _WORD)[:, :cols] - (1 << (bits - 1))).to(torch.int8)
    return values.T.contiguous() if dim == 0 else values
