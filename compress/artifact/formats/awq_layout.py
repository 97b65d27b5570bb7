"""The AutoAWQ "GEMM" checkpoint layout, for engines that read only that.

Per quantized linear X with weight [out, in], 4-bit, group g, zero point:

  X.qweight  int32 [in, out/8]      the integers, transposed, 8 per word along `out`
  X.qzeros   int32 [in/g, out/8]    zero points, packed the same way
  X.scales   fp16  [in/g, out]

Integers are stored unsigned (q + 8, zero point + 8), weight = (q - zero) * scale. Within
a word the 8 values of columns c..c+7 sit in nibbles in the order 0, 2, 4, 6, 1, 3, 5, 7
(nibble i holds column c + ORDER[i]), the interleaving AWQ's GEMM kernels expect.
config.json: quant_method "awq", version "gemm", bits 4, group_size, zero_point true.
"""

from __future__ import annotations

import torch

from compress.errors import LlmpressError
from compress.quantizers.scheme import QuantizedWeight

ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
SUFFIXES = ("qweight", "qzeros", "scales")


def pack_awq(values: torch.Tensor) -> torch.Tensor:
    """[rows, cols] unsigned 4-bit values (cols % 8 == 0) → int32 [rows, cols/8]."""
    v = values.to(torch.int64).reshape(values.shape[0], -1, 8)
    word = torch.zeros(v.shape[:2], dtype=torch.int64)
    for nibble, column in enumerate(ORDER):
        word |= v[:, :, column] << (4 * nibble)
    return torch.where(word >= 1 << 31, word - (1 << 32), word).to(torch.int32)


def unpack_awq(words: torch.Tensor) -> torch.Tensor:
    w = words.to(torch.int64) & 0xFFFFFFFF
    out = torch.empty(*w.shape, 8, dtype=torch.int64)
    for nibble, column in enumerate(ORDER):
        out[:, :, column] = (w >> (4 * nibble)) & 0xF
    return out.reshape(w.shape[0], -1)


def check_awq_compatible(qw: QuantizedWeight, name: str) -> None:
    s = qw.scheme
    if s.bits != 4 or not s.zero_point or qw.shape[0] % 8:
        raise LlmpressError(
            f"{name}: the AWQ GEMM layout holds only 4-bit weights with a zero point and an "
            "output width divisible by 8; export compressed-tensors instead"
        )


def encode_awq(prefix: str, qw: QuantizedWeight) -> dict[str, torch.Tensor]:
    check_awq_compatible(qw, prefix)
    return {
        f"{prefix}.qweight": pack_awq((qw.q.to(torch.int64) + 8).T.contiguous()),
        f"{prefix}.qzeros": pack_awq((qw.zero_point.to(torch.int64) + 8).T.contiguous()),
        f"{prefix}.scales": qw.scale.T.to(torch.float16).contiguous(),
    }


def awq_codes(prefix: str, tensors: dict[str, torch.Tensor], group_size: int):
    """(q, scale, zero point, group) of one GEMM-layout linear, signed as llmpress keeps them."""
    q = unpack_awq(tensors[f"{prefix}.qweight"]).T - 8  # [out, in]
    zeros = unpack_awq(tensors[f"{prefix}.qzeros"]).T - 8  # [out, in/g]
    scales = tensors[f"{prefix}.scales"].T.float()
    return q.to(torch.int8), scales, zeros.to(torch.int8), group_size


def awq_config(group_size: int, not_converted: list[str]) -> dict:
    return {
        "quant_method": "awq",
        "version": "gemm",
        "bits": 4,
        "group_size": group_size,
        "zero_point": True,
        "modules_to_not_convert": not_converted or None,
    }
