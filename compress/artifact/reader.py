"""Read an artifact (or any checkpoint) back as dense weights, with llmpress's own decoder."""

from __future__ import annotations

import torch

from compress.artifact.formats import reading_codec
from compress.model.loading import Checkpoint, read_tensors


def quantized_layers(config: dict, tensors: dict[str, torch.Tensor]):
    """(the codec that reads this checkpoint, {prefix: its stored args}) of every quantized
    linear, as config.json describes them; (None, {}) for a dense checkpoint."""
    codec = reading_codec(config)
    return (None, {}) if codec is None else (codec, codec.layers(config, tensors))


def dense_state_dict(ckpt: Checkpoint) -> dict[str, torch.Tensor]:
    tensors = read_tensors(ckpt)
    codec, layers = quantized_layers(ckpt.config, tensors)
    out = {}
    for name, tensor in tensors.items():
        prefix, _, leaf = name.rpartition(".")
        if prefix in layers and (leaf in codec.suffixes or leaf == "weight"):
            continue
        out[name] = tensor
    for prefix, args in layers.items():
        out[f"{prefix}.weight"] = codec.decode(prefix, tensors, args).dequantize()
    return out


def token_int8_layers(ckpt: Checkpoint) -> dict[str, torch.Tensor]:
    """Linears whose inputs are quantized per token at run time (W8A8), each with its
    outlier columns (empty where none were kept)."""
    codec = reading_codec(ckpt.config)
    return {} if codec is None else codec.token_int8_layers(ckpt)
