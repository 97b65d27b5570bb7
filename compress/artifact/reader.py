"""Read an artifact (or any checkpoint) back as dense weights, with llmpress's own decoder."""

from __future__ import annotations

import torch

from compress.artifact.awq_format import decode_awq
from compress.artifact.ct_format import decode, target_matches
from compress.errors import LlmpressError
from compress.model.loading import Checkpoint, read_tensors

_QUANT_SUFFIXES = (
    *("weight_packed", "weight_scale", "weight_zero_point", "weight_shape"),
    *("qweight", "qzeros", "scales"),
    *("weight_outlier_index", "weight_outlier"),
)
AWQ_GEMM = "awq-gemm"


def quantized_layers(config: dict, tensors: dict[str, torch.Tensor]) -> dict[str, tuple[dict, str]]:
    """Each quantized linear's (weight args, storage format), as config.json describes it."""
    qc = config.get("quantization_config")
    if not qc:
        return {}
    if qc.get("quant_method") == "awq":
        if qc.get("version", "gemm").lower() != "gemm" or qc.get("bits") != 4:
            raise LlmpressError("llmpress reads AWQ checkpoints in the 4-bit GEMM layout only")
        prefixes = sorted(k[: -len(".qweight")] for k in tensors if k.endswith(".qweight"))
        return {p: ({"group_size": qc["group_size"]}, AWQ_GEMM) for p in prefixes}
    if qc.get("quant_method") != "compressed-tensors":
        raise LlmpressError(
            f"quantization method {qc.get('quant_method')!r} is not supported: llmpress reads "
            "compressed-tensors checkpoints and dense ones"
        )
    prefixes = sorted(k[: -len(".weight_scale")] for k in tensors if k.endswith(".weight_scale"))
    layers = {}
    for prefix in prefixes:
        for group in qc["config_groups"].values():
            if target_matches(prefix, group["targets"]):
                layers[prefix] = (group["weights"], group.get("format") or qc["format"])
                break
        else:
            raise LlmpressError(
                f"{prefix} has quantized tensors but no config group targets it: config.json "
                "does not match the weights; re-export the artifact"
            )
    return layers


def dense_state_dict(ckpt: Checkpoint) -> dict[str, torch.Tensor]:
    tensors = read_tensors(ckpt)
    layers = quantized_layers(ckpt.config, tensors)
    out = {}
    for name, tensor in tensors.items():
        prefix, _, leaf = name.rpartition(".")
        if prefix in layers and (leaf in _QUANT_SUFFIXES or leaf == "weight"):
            continue
        out[name] = tensor
    for prefix, (args, fmt) in layers.items():
        if fmt == AWQ_GEMM:
            out[f"{prefix}.weight"] = decode_awq(prefix, tensors, args["group_size"])
        else:
            out[f"{prefix}.weight"] = decode(prefix, tensors, args, fmt)
        index = tensors.get(f"{prefix}.weight_outlier_index")
        if index is not None:  # LLM.int8()-style: 16-bit columns replace their int8 values
            out[f"{prefix}.weight"][:, index.long()] = tensors[f"{prefix}.weight_outlier"].float()
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
    names = [n for n in ckpt.tensors if n.endswith(".weight_outlier_index")]
    outliers = {
        n.removesuffix(".weight_outlier_index"): t for n, t in read_tensors(ckpt, names).items()
    }
    scaled = sorted(
        n.removesuffix(".weight_scale") for n in ckpt.tensors if n.endswith(".weight_scale")
    )
    return {
        p: outliers.get(p, torch.empty(0, dtype=torch.int32))
        for p in scaled
        if any(target_matches(p, g["targets"]) for g in groups)
    }
