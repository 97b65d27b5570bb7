"""The linear layers the runtime runs: dense, or quantized and kept packed.

Each is a callable [rows, in] -> [rows, out] with the bytes one call reads (`nbytes`, for
MBU). The CPU kernels need a group size that is a multiple of 32; a layer that does not fit
runs dense (dequantized once at load) and is reported as such.
"""

from __future__ import annotations

import torch

from compress.kernels.cpu import (
    FusedLinear,
    PackedLinear,
    QuantizedInput,
    gemv_f32,
    gemv_rows,
    quantize_input,
    sliced_product,
)


class DenseLinear:
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        self.weight = weight.contiguous()
        self.bias = bias
        self.out_features, self.in_features = weight.shape
        self.kind = f"dense {str(weight.dtype).removeprefix('torch.')}"

    @property
    def nbytes(self) -> int:
        return self.weight.numel() * self.weight.element_size()

    def __call__(self, x, exact: bool | None = None, out=None) -> torch.Tensor:
        """`out`: a contiguous fp32 [rows, out_features] the product of a batch is written
        in (a caller's kept buffer), where no bias is added."""
        x = x.x if isinstance(x, QuantizedInput) else x
        w = self.weight
        cpu = w.device.type == "cpu"
        if cpu and x.dim() == 2 and 0 < x.shape[0] <= gemv_rows(w.dtype):
            y = gemv_f32(x, w)  # decode: w streamed once, in its stored width
        elif cpu and w.dtype != torch.float32:  # fp32 products, a slice of w widened at a time
            widen = lambda lo, hi, buf: buf.copy_(w[lo:hi])  # noqa: E731
            y = sliced_product(x.float(), *w.shape, widen, out=out if self.bias is None else None)
        elif out is not None and self.bias is None and w.dtype == x.dtype == torch.float32:
            y = torch.mm(x, w.t(), out=out)
        else:
            y = torch.nn.functional.linear(x.to(w.dtype), w).float()
        return y if self.bias is None else y + self.bias


class QuantLinear:
    """A packed int4/int8 weight; LLM.int8()-style outlier columns run in 16-bit beside it."""

    def __init__(self, packed: PackedLinear, bias=None, outlier_index=None, outlier_weight=None):
        self.packed, self.bias = packed, bias
        self.out_features, self.in_features = packed.out_features, packed.in_features
        self.outlier_index = None if outlier_index is None else outlier_index.long()
        self.outlier_weight = None if outlier_weight is None else outlier_weight.float()
        self._fused = None
        self.kind = f"int{packed.bits} g{packed.group}"
        if self.outlier_index is not None:
            self.kind += f" +{len(self.outlier_index)} fp16 cols"

    @property
    def nbytes(self) -> int:
        extra = 0
        if self.outlier_index is not None:
            extra = self.outlier_weight.numel() * 2 + self.outlier_index.numel() * 4
        return self.packed.nbytes + extra

    def fused_form(self) -> FusedLinear:
        """What the one-call C decoder takes: the packed weight, its outlier columns as
        (int32 indices, contiguous fp32 weights) and its bias."""
        if self._fused is None:
            outliers = None
            if self.outlier_index is not None:
                idx = self.outlier_index.to(torch.int32).contiguous()
                outliers = (idx, self.outlier_weight.contiguous())
            bias = None if self.bias is None else self.bias.float().contiguous()
            self._fused = FusedLinear(self.packed, outliers, bias)
        return self._fused

    def __call__(self, x, exact: bool | None = None) -> torch.Tensor:
        """`exact`: see PackedLinear.__call__."""
        if self.outlier_index is None:
            y = self.packed(x, exact)
        else:  # the decomposition: outlier columns in full precision, the rest in int8
            xf = x.x if isinstance(x, QuantizedInput) else x
            regular = xf.clone()
            regular[:, self.outlier_index] = 0  # keeps them out of the activation scales
            if isinstance(x, QuantizedInput):  # int8 activations asked for: keep them
                regular = quantize_input(regular)
            y = self.packed(regular, exact) + xf[:, self.outlier_index] @ self.outlier_weight.T
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

    def __call__(self, x, exact: bool | None = None) -> torch.Tensor:  # always fp32
        from compress.kernels.triton_matmul import dequant_matmul

        x = x.x if isinstance(x, QuantizedInput) else x
        y = dequant_matmul(
            x, self.weight, self.scale, self.zero_point, self.group, self.bits, self.in_features
        )
        return y if self.bias is None else y + self.bias


class ConcatLinear:
    """Several linears reading one input, their outputs side by side (a layout that the
    fused kernels cannot take: mixed formats, outlier columns, biases)."""

    def __init__(self, parts):
        self.parts = parts
        self.in_features = parts[0].in_features
        self.out_features = sum(p.out_features for p in parts)
        self.kind = " | ".join(p.kind for p in parts)

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    def __call__(self, x, exact: bool | None = None) -> torch.Tensor:
        return torch.cat([p(x, exact) for p in self.parts], dim=-1)


def fold_input_shift(lin, shift: torch.Tensor) -> None:
    """Make `lin(x)` compute lin(x + shift) for every x: W·shift joins its bias (a norm's
    bias, folded into the linears that read the norm, so no kernel adds it). W·shift is
    taken through the exact (dequantized) product, the weights the linear runs."""
    if isinstance(lin, ConcatLinear):
        for part in lin.parts:
            fold_input_shift(part, shift)
        return
    lin.bias = lin(shift[None].float(), True)[0].contiguous()  # W·shift + the old bias
    if hasattr(lin, "_fused"):
        lin._fused = None  # fused_form reads the bias anew


def _joined_bias(parts):
    """The parts' biases side by side (zeros where a part has none), or None."""
    if all(p.bias is None for p in parts):
        return None
    return torch.cat(
        [p.bias.float() if p.bias is not None else torch.zeros(p.out_features) for p in parts]
    )


def fuse(parts):
    """One linear for `parts` that read the same input, as fast as their layouts allow."""
    packed = all(isinstance(p, QuantLinear) for p in parts)
    if packed and len({(p.packed.bits, p.packed.group, p.packed.kp) for p in parts}) == 1:
        indices = [p.outlier_index for p in parts]
        joined, bias = PackedLinear.concat([p.packed for p in parts]), _joined_bias(parts)
        if all(i is None for i in indices):
            return QuantLinear(joined, bias)
        # one input, so one set of outlier columns (same activations, same selection)
        if all(i is not None and torch.equal(i, indices[0]) for i in indices):
            weight = torch.cat([p.outlier_weight for p in parts])
            return QuantLinear(joined, bias, indices[0], weight)
    dense = all(isinstance(p, DenseLinear) for p in parts)
    if dense and len({p.weight.dtype for p in parts}) == 1:
        return DenseLinear(torch.cat([p.weight for p in parts]), _joined_bias(parts))
    return ConcatLinear(parts)
