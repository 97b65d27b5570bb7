"""What vLLM's and transformers' compressed-tensors loaders take, kept as data.

vLLM 0.32.0 (artifact/engine_rules.py says where its sources were read), under
vllm/model_executor/:
  layers/quantization/compressed_tensors/compressed_tensors.py
    `_quantization_scheme_map_from_config`: a weight-only group stored in an activation
      format (int-quantized) trips `assert weights.type == FLOAT`;
    `_get_scheme_from_parts`: weight-only integers become CompressedTensorsWNA16 only when
      pack-quantized; W8A8 int8 needs symmetric 8-bit weights per channel or tensor and
      8-bit activations per token (dynamic) or per tensor (static); anything else raises
      NotImplementedError "No compressed-tensors compatible scheme";
    `get_quant_method`: a ParallelLMHead (lm_head) gets a scheme like any linear.
  layers/quantization/compressed_tensors/utils.py: `_match_fused_layer` gives a fused
    qkv_proj / gate_up_proj the scheme of its first member (the others' tensors then
    fail the shape assertions of parameter.py), `should_ignore_layer` raises when only some
    members are in `ignore`.
  layers/quantization/compressed_tensors/schemes/compressed_tensors_wNa16.py: b bits are
    the scalar type uint{b}b{2^(b-1)} (symmetric) or uint{b} (zero point).
transformers 5.23 with compressed-tensors 0.20 (`CompressedTensorsHfQuantizer`,
`PackedQuantizationCompressor`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from compress.artifact.engine_rules import (
    ASSERT,
    FUSED,
    UNKNOWN,
    Linear,
    Problem,
    kernel_problem,
    linears,
)
from compress.artifact.formats.ct_layout import INT, OUTLIER_SUFFIXES, PACKED

SCHEME = r"No compressed-tensors compatible scheme"  # vLLM's error when no scheme fits

# weight-only integers are read only as pack-quantized; in an activation format they
# trip the assertion that only float weights may lack input_activations
WEIGHT_ONLY_FORMAT = PACKED
ACTIVATION_FORMATS = (INT, "naive-quantized", "float-quantized")
W8A8_WEIGHT_STRATEGIES = ("channel", "tensor")  # symmetric 8-bit, one scale per row or all
QUANTIZED_LM_HEAD = True  # ParallelLMHead gets a scheme like a linear (0.32)
# AutoWeightsLoader raises on a tensor name the model has no parameter for
UNKNOWN_TENSOR_SUFFIXES = OUTLIER_SUFFIXES


def groups(config: dict) -> list[dict]:
    qc = config.get("quantization_config") or {}
    return list((qc.get("config_groups") or {}).values())


def _matches(name: str, targets: Iterable[str]) -> bool:
    """vLLM's target matching: `re:` regexes (re.match), exact names, and a module class
    name ("Linear") that every linear's class contains."""
    for t in targets:
        if t.startswith("re:"):
            if re.match(t[3:], name):
                return True
        elif t == name or (t == "Linear" and not name.endswith("lm_head")):
            return True
    return False


def _scheme_of(config: dict, name: str) -> dict | None:
    """The config group that quantizes linear `name` (None: it stays in 16 bits)."""
    qc = config.get("quantization_config") or {}
    if _matches(name, qc.get("ignore") or []):
        return None
    for group in groups(config):
        if _matches(name, group.get("targets") or []):
            return group
    return None


def _key(group: dict | None, qc: dict):
    if group is None:
        return None
    w = group.get("weights") or {}
    return (
        w.get("num_bits"),
        bool(w.get("symmetric", True)),
        w.get("strategy"),
        w.get("group_size"),
        repr(sorted((group.get("input_activations") or {}).items())),
        group.get("format") or qc.get("format"),
    )


def _describe(group: dict | None) -> str:
    if group is None:
        return "16-bit"
    w = group.get("weights") or {}
    g = f"g{w['group_size']}" if w.get("strategy") == "group" else ""
    act = "a8" if group.get("input_activations") else ""
    return f"w{w.get('num_bits')}{g}{'' if w.get('symmetric', True) else 'zp'}{act}"


def _layer_problems(group: dict, qc: dict, lin: Linear, device: str, dtype: str) -> list[Problem]:
    w = group.get("weights") or {}
    bits, strategy, gs = w.get("num_bits"), w.get("strategy"), w.get("group_size")
    fmt = group.get("format") or qc.get("format")
    symmetric = w.get("symmetric", True)
    act = group.get("input_activations")
    if act:
        if (
            fmt in ACTIVATION_FORMATS
            and bits == 8
            and act.get("num_bits") == 8
            and symmetric
            and strategy in W8A8_WEIGHT_STRATEGIES
            and (act.get("strategy"), act.get("dynamic")) in (("token", True), ("tensor", False))
        ):
            return []
        return [
            Problem(
                f"W8A8 layers need symmetric 8-bit weights per channel and int8 activations "
                f"per token, stored {INT}; not {_describe(group)} as {fmt}",
                SCHEME,
            )
        ]
    if fmt in ACTIVATION_FORMATS:
        return [Problem(f"weight-only {bits}-bit layers must be {PACKED}, not {fmt}", ASSERT)]
    if fmt != WEIGHT_ONLY_FORMAT or strategy not in ("group", "channel"):
        return [
            Problem(f"weight-only {bits}-bit {strategy} layers stored {fmt} have no scheme", SCHEME)
        ]
    group_size = -1 if strategy == "channel" else gs
    found = kernel_problem(device, bits, not symmetric, group_size, lin.k, lin.n, dtype)
    return [found] if found else []


def _fused_problems(config: dict, qc: dict, built: list[Linear]) -> list[Problem]:
    """Fused linears whose members have different schemes, once per kind of fusion."""
    found: dict[tuple, list[str]] = {}
    for lin in built:
        if len(lin.members) < 2:
            continue
        chosen = [_scheme_of(config, m) for m in lin.members]
        if len({_key(g, qc) for g in chosen}) > 1:
            # each kind once with its schemes (an MoE layer's members are every expert's)
            by_kind: dict[str, dict[str, None]] = {}
            for member, group in zip(lin.members, chosen, strict=True):
                by_kind.setdefault(member.rsplit(".", 1)[1], {})[_describe(group)] = None
            schemes = ", ".join(f"{k} {'/'.join(d)}" for k, d in by_kind.items())
            prefix = lin.members[0].rsplit(".", 2)[0]
            found.setdefault(tuple(by_kind), []).append(f"{prefix}: {schemes}")
    return [
        Problem(
            f"{'/'.join(kinds)} have different schemes in {len(where)} block(s) ({where[0]}): "
            "vLLM loads them as one fused linear with one scheme",
            FUSED,
        )
        for kinds, where in found.items()
    ]


def vllm_problems(
    config: dict, tensor_names: list[str], device: str, dtype: str
) -> tuple[list[Problem], bool]:
    """(why vLLM's compressed-tensors loader on `device` refuses these layers, whether
    any is weight-only and so runs a WNA16 kernel)."""
    qc = config["quantization_config"]
    out: list[Problem] = []
    wna16 = False
    built = linears(config)
    if len(built) == 1:  # no layer names or widths in the config: check each group
        for group in groups(config):
            wna16 = wna16 or not group.get("input_activations")
            out += _layer_problems(group, qc, Linear("", (), None, None), device, dtype)
    else:
        for lin in built:
            group = _scheme_of(config, lin.members[0])
            if group is None:
                continue
            if lin is built[-1] and not QUANTIZED_LM_HEAD:
                out.append(Problem("a quantized lm_head is not read", UNKNOWN))
                continue
            wna16 = wna16 or not group.get("input_activations")
            out += _layer_problems(group, qc, lin, device, dtype)
        out += _fused_problems(config, qc, built)
    unknown = sorted({n.rpartition(".")[2] for n in tensor_names} & set(UNKNOWN_TENSOR_SUFFIXES))
    if unknown:
        out.append(
            Problem(
                f"tensors {', '.join(unknown)} (16-bit outlier columns) are unknown to its "
                "loader; --export compressed-tensors leaves them out",
                UNKNOWN,
            )
        )
    return out, wna16


# transformers: compressed-tensors 0.20 registers packed zero points unpacked ([out,
# groups]) on the meta model, so a packed [out*b/32, groups] tensor is a size mismatch:
# asymmetric pack-quantized loads only with CompressedTensorsConfig(dequantize=True), and
# that dequantize path applies the first config group's group size to all layers.


def _zero_point(config: dict) -> bool:
    return any(not (g.get("weights") or {}).get("symmetric", True) for g in groups(config))


def _group_sizes(config: dict) -> set:
    return {(g.get("weights") or {}).get("group_size") for g in groups(config)}


def transformers_problems(config: dict) -> list[str]:
    if not _zero_point(config):
        return []
    sizes = _group_sizes(config)
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
    if not _zero_point(config):
        return {}
    return None if len(_group_sizes(config)) > 1 else {"dequantize": True}
