"""The linear layers the runtime runs: dense, or quantized and kept packed.

Each is a callable [rows, in] -> [rows, out] with the bytes one call reads (`nbytes`, for
MBU). The CPU kernels need a group size that is a multiple of 32; a layer that does not fit
runs dense (dequantized once at load) and is reported as such.
"""

from __future__ import annotations

import torch

from compress.kernels.cpu import PackedLinear, QuantizedInput


class DenseLinear:
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        self.weight = weight.contiguous()
        self.bias = bias
        self.out_features, self.in_features = weight.shape
        self.kind = f"dense {str(weight.dtype).removeprefix('torch.')}"

    @property
    def nbytes(self) -> int:
        return self.weight.numel() * self.weight.element_size()

    def __call__(self, x) -> torch.Tensor:
        x = x.x if isinstance(x, QuantizedInput) else x
        y = torch.nn.functional.linear(x.to(self.weight.dtype), self.weight)
        y = y.float()
        return y if self.bias is None else y + self.bias


class QuantLinear:
    """A packed int4/int8 weight; LLM.int8()-style outlier columns run in 16-bit beside it."""

    def __init__(self, packed: PackedLinear, bias=None, outlier_index=None, outlier_weight=None):
        self.packed, self.bias = packed, bias
        self.out_features, self.in_features = packed.out_features, packed.in_features
        self.outlier_index = None if outlier_index is None else outlier_index.long()
        self.outlier_weight = None if outlier_weight is None else outlier_weight.float()
        self.kind = f"int{packed.bits} g{packed.group}"
        if self.outlier_index is not None:
            self.kind += f" +{len(self.outlier_index)} fp16 cols"

    @property
    def nbytes(self) -> int:
        extra = 0
        if self.outlier_index is not None:
            extra = self.outlier_weight.numel() * 2 + self.outlier_index.numel() * 4
        return self.packed.nbytes + extra

    def __call__(self, x) -> torch.Tensor:
        y = self.packed(x)
        if self.outlier_index is not None:
            xf = x.x if isinstance(x, QuantizedInput) else x
            y = y + xf[:, self.outlier_index] @ self.outlier_weight.T
        return y if self.bias is None else y + self.bias


class TritonQuantLinear:
    """GPU: the weight as the artifact stores it (compressed-tensors packing), dequantized
    inside a Triton matmul (compress/kernels/triton_matmul.py)."""

    def __init__(self, weight, scale, zero_point, group_size, bits, in_features, bias=None):
        self.weight, self.scale, self.zero_point = weight, scale.float(), zero_point
        self.group, self.bits, self.in_features = group_size, bits, in_features
        self.out_features = weight.shape[0]
        self.bias = bias
        self.kind = f"int{bits} g{group_size} (triton)"

    @property
    def nbytes(self) -> int:
        parts = [self.weight, self.scale] + (
            [self.zero_point] if self.zero_point is not None else []
        )
        return sum(t.numel() * t.element_size() for t in parts)

    def __call__(self, x) -> torch.Tensor:
        from compress.kernels.triton_matmul import dequant_matmul

        x = x.x if isinstance(x, QuantizedInput) else x
        y = dequant_matmul(
            x, self.weight, self.scale, self.zero_point, self.group, self.bits, self.in_features
        )
        return y if self.bias is None else y + self.bias
