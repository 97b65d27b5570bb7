"""Read an artifact (or any checkpoint) back as dense weights, with llmpress's own decoder."""

from __future__ import annotations

import torch

from compress.artifact.codecs import reading_codec
from compress.artifact.ct_format import OUTLIER_INDEX, target_matches
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
    qc = ckpt.config.get("quantization_config") or {}
    groups = [
        g
        for g in qc.get("config_groups", {}).values()
        if (g.get("input_activations") or {}).get("strategy") == "token"
    ]
    if not groups:
        return {}
    names = [n for n in ckpt.tensors if n.endswith(f".{OUTLIER_INDEX}")]
    outliers = {
        n.removesuffix(f".{OUTLIER_INDEX}"): t for n, t in read_tensors(ckpt, names).items()
    }
    scaled = sorted(
        n.removesuffix(".weight_scale") for n in ckpt.tensors if n.endswith(".weight_scale")
    )
    return {
        p: outliers.get(p, torch.empty(0, dtype=torch.int32))
        for p in scaled
        if any(target_matches(p, g["targets"]) for g in groups)
    }
