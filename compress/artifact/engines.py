"""Which engines load which artifacts: the rules their loaders apply, kept as data.

llmpress cannot run vLLM here (no GPU), and a claim that an artifact "loads in vLLM"
must not rest on hope. So the checks that vLLM's compressed-tensors loader and kernels
apply are written down below, each with where it comes from, and every artifact's
config is checked against them when it is written (compress warns, naming the engine
and the reason) and in tests. transformers is run for real in tests/test_interop.py;
its rules here are the known failures of its loader, so that compress can warn first.

Sources (read 2026-11): vLLM 0.33 `compressed_tensors.py` (`_quantization_scheme_map_from_
config`, `_get_scheme_from_parts`), `schemes/compressed_tensors_wNa16.py`
(WNA16_SUPPORTED_TYPES_MAP, WNA16_ZP_SUPPORTED_TYPES_MAP), `kernels/linear/mixed_precision/
marlin.py` and `machete.py` (group sizes), `models/llama.py` (`load_weights` indexes
`params_dict` by every checkpoint name); transformers 5.23 with compressed-tensors 0.20
(`CompressedTensorsHfQuantizer`, `PackedQuantizationCompressor`).
"""

from __future__ import annotations

from collections.abc import Iterable

from compress.artifact.ct_format import OUTLIER_SUFFIXES

VLLM = {
    # weight-only integer layers run as WNA16: only the pack-quantized format; an
    # int-quantized weight-only group trips an assertion that only float weights may
    # lack input_activations
    "weight_only_format": "pack-quantized",
    "weight_only_bits_symmetric": (2, 3, 4, 5, 6, 7, 8),
    "weight_only_bits_zero_point": (4,),  # 8 is admitted, then Marlin fails at first forward
    "weight_only_strategies": ("group", "channel"),
    # the CUDA kernels for group-quantized int weights (Marlin 32/64/128, Machete 64/128)
    "kernel_group_sizes": (32, 64, 128),
    # W8A8 (int8 activations per token, dynamic): int-quantized, symmetric weights, one
    # scale per channel or tensor
    "w8a8_format": "int-quantized",
    "w8a8_weight_strategies": ("channel", "tensor"),
    # the lm_head is a ParallelLMHead, not a LinearBase: compressed-tensors quantizes
    # only linears, so packed lm_head tensors find no parameter
    "quantized_lm_head": False,
    # llama.load_weights raises KeyError on a tensor name the model has no parameter for
    "unknown_tensor_suffixes": OUTLIER_SUFFIXES,
}

TRANSFORMERS = {
    # compressed-tensors 0.20 registers packed zero points unpacked ([out, groups]) on the
    # meta model, so a packed [out*b/32, groups] tensor is a size mismatch: asymmetric
    # pack-quantized loads only with CompressedTensorsConfig(dequantize=True)
    "zero_point_needs_dequantize": True,
    # and that dequantize path applies the first config group's group size to all layers
    "dequantize_mixed_group_sizes": False,
    # AutoAWQ's GEMM layout needs the gptqmodel package
    "awq_needs": "gptqmodel",
}


def _groups(config: dict) -> list[dict]:
    qc = config.get("quantization_config") or {}
    return list((qc.get("config_groups") or {}).values())


def _targets_lm_head(group: dict) -> bool:
    return any(t == "lm_head" or t.endswith(".lm_head") for t in group.get("targets", []))


def vllm_problems(config: dict, tensor_names: Iterable[str] = ()) -> list[str]:
    """Why vLLM would refuse (or crash on) an artifact with this config.json and these
    tensor names; [] when every rule above holds."""
    qc = config.get("quantization_config") or {}
    if not qc:
        return []
    if qc.get("quant_method") == "awq":
        group = qc.get("group_size")
        if qc.get("bits") != 4 or group not in VLLM["kernel_group_sizes"]:
            return [f"AWQ with {qc.get('bits')} bits and group {group}: no vLLM kernel"]
        return []
    out = []
    for group in _groups(config):
        w = group.get("weights") or {}
        bits, strategy, gs = w.get("num_bits"), w.get("strategy"), w.get("group_size")
        fmt = group.get("format") or qc.get("format")
        symmetric = w.get("symmetric", True)
        if group.get("input_activations"):
            if fmt != VLLM["w8a8_format"] or bits != 8 or not symmetric:
                out.append(f"W8A8 layers must be int-quantized symmetric 8-bit, not {fmt}")
            elif strategy not in VLLM["w8a8_weight_strategies"]:
                out.append(f"W8A8 weights must be per channel, not {strategy} (group {gs})")
            continue
        if fmt != VLLM["weight_only_format"]:
            out.append(f"weight-only {bits}-bit layers must be pack-quantized, not {fmt}")
        elif strategy not in VLLM["weight_only_strategies"]:
            out.append(f"strategy {strategy!r} is not group or channel")
        elif symmetric and bits not in VLLM["weight_only_bits_symmetric"]:
            out.append(f"{bits}-bit weights are not supported")
        elif not symmetric and bits not in VLLM["weight_only_bits_zero_point"]:
            out.append(f"{bits}-bit weights with a zero point have no working kernel")
        elif strategy == "group" and gs not in VLLM["kernel_group_sizes"]:
            kernels = ", ".join(map(str, VLLM["kernel_group_sizes"]))
            out.append(f"group size {gs} has no CUDA kernel (they take {kernels})")
        if _targets_lm_head(group) and not VLLM["quantized_lm_head"]:
            out.append("a quantized lm_head is not read by its compressed-tensors loader")
    unknown = sorted(
        {n.rpartition(".")[2] for n in tensor_names} & set(VLLM["unknown_tensor_suffixes"])
    )
    if unknown:
        out.append(
            f"tensors {', '.join(unknown)} (16-bit outlier columns) are unknown to its "
            "loader; --export compressed-tensors leaves them out"
        )
    return list(dict.fromkeys(out))


def transformers_problems(config: dict) -> list[str]:
    """Why plain `AutoModelForCausalLM.from_pretrained` fails on this config.json."""
    qc = config.get("quantization_config") or {}
    if qc.get("quant_method") == "awq":
        return [f"the AWQ GEMM layout needs the {TRANSFORMERS['awq_needs']} package"]
    groups = _groups(config)
    zero_point = [g for g in groups if not (g.get("weights") or {}).get("symmetric", True)]
    if not zero_point:
        return []
    sizes = {(g.get("weights") or {}).get("group_size") for g in groups}
    if len(sizes) > 1:
        return [
            f"asymmetric weights with several group sizes ({sorted(map(str, sizes))}): no "
            "transformers loader reads them (dequantize=True applies the first size to all)"
        ]
    return [
        "asymmetric (zero-point) weights: only CompressedTensorsConfig(dequantize=True) "
        "loads them in transformers 5 (compressed-tensors registers the zero point unpacked)"
    ]


def transformers_route(config: dict) -> dict | None:
    """The keyword arguments `from_pretrained` needs for this config.json: {} for the plain
    call, `dequantize=True` for zero points, None when transformers cannot load it."""
    qc = config.get("quantization_config") or {}
    if qc.get("quant_method") == "awq":
        return None
    groups = _groups(config)
    if not any(not (g.get("weights") or {}).get("symmetric", True) for g in groups):
        return {}
    if len({(g.get("weights") or {}).get("group_size") for g in groups}) > 1:
        return None
    return {"dequantize": True}


def engine_problems(config: dict, tensor_names: Iterable[str] = ()) -> dict[str, list[str]]:
    """{"vllm": [...], "transformers": [...]}: what each engine will refuse."""
    return {
        "vllm": vllm_problems(config, tensor_names),
        "transformers": transformers_problems(config),
    }
