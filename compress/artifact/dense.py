"""A checkpoint or artifact as a dense transformers model: quantized weights decoded to
floats, W8A8 layers (LLM.int8()-style, activations int8 per token) rebuilt as the
decomposition they compute. What `eval`, the tests and the benchmarks compare against."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from compress.artifact.reader import dense_state_dict, token_int8_layers
from compress.model.loading import Checkpoint, build_model


def load_model(ckpt: Checkpoint, dtype: torch.dtype = torch.float32):
    """The checkpoint as a dense transformers model (quantized artifacts are dequantized)."""
    model = build_model(ckpt.config, dense_state_dict(ckpt), ckpt.adapter)
    decompose(model, token_int8_layers(ckpt))  # W8A8 layers: activations int8 per token
    return model.to(dtype)


def quantize_per_token(x: torch.Tensor) -> torch.Tensor:
    """Dynamic symmetric int8 per token, as compressed-tensors defines it (scale absmax/127.5)."""
    scale = x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-8) / 127.5
    return torch.round(x / scale).clamp(-128, 127) * scale


class DecomposedLinear(torch.nn.Module):
    """x[:, regular] quantized per token to int8 · Ŵ_regularᵀ + x[:, outliers] · W_16ᵀ."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, outliers: torch.Tensor):
        super().__init__()
        idx = outliers.long()
        regular = weight.detach().clone()
        regular[:, idx] = 0
        self.register_buffer("regular", regular)
        self.register_buffer("outlier_columns", weight.detach()[:, idx].clone())
        self.register_buffer("index", idx)
        self.bias = bias
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xr = x.clone()
        xr[..., self.index] = 0
        y = F.linear(quantize_per_token(xr), self.regular, self.bias)
        if self.index.numel():
            y = y + F.linear(x[..., self.index], self.outlier_columns)
        return y


def decompose(model: torch.nn.Module, outliers: dict[str, torch.Tensor]) -> None:
    """Swap each named linear for its W8A8 decomposition (weights already dequantized)."""
    for name, idx in outliers.items():
        parent, _, child = name.rpartition(".")
        owner = model.get_submodule(parent) if parent else model
        linear = getattr(owner, child)
        setattr(owner, child, DecomposedLinear(linear.weight, linear.bias, idx))
