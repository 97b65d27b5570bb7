"""The compressed-tensors on-disk format: tensor names, packing, and config keys.

Kept apart from the algorithms and kernels so that what transformers and vLLM read is
decided in one place. Per quantized linear `X`:

  pack-quantized (weight-only, any bits 2..8; vLLM's WNA16 layout):
                               X.weight_packed int32 [out, ceil(in*b/32)]   (packing.py)
                               X.weight_scale  [out, in/group]               storage dtype
                               X.weight_zero_point int32 [ceil(out*b/32), in/group]  (asymmetric)
                               X.weight_shape  int64 [2]
  int-quantized (W8A8: int8 activations too):
                               X.weight int8 [out, in], X.weight_scale, X.weight_zero_point int8

Per-channel quantization is one group spanning the row (`strategy: channel`, scale [out, 1]).

LLM.int8()-style outliers add X.weight_outlier_index int32 [k] and X.weight_outlier
16-bit [out, k]: input columns llmpress runs in 16-bit instead of their int8 values. Other
readers see an ordinary int8 weight (and, at most, warn about the two extra tensors);
`--export compressed-tensors` leaves them out.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import torch

from compress.errors import LlmpressError
from compress.quantizers.packing import pack, unpack
from compress.quantizers.scheme import QuantizedWeight

PACKED = "pack-quantized"
INT = "int-quantized"
MIXED = "mixed-precision"
SUFFIXES = ("weight_packed", "weight_scale", "weight_zero_point", "weight_shape")
OUTLIER_INDEX, OUTLIER_WEIGHT = "weight_outlier_index", "weight_outlier"
OUTLIER_SUFFIXES = (OUTLIER_INDEX, OUTLIER_WEIGHT)


def storage_format(activations: str | None) -> str:
    """Weight-only layers are packed at every bit width (vLLM reads weight-only integers
    only as pack-quantized); layers with quantized activations store plain int8."""
    return INT if activations else PACKED


@dataclass(frozen=True)
class LayerFormat:
    """What config.json must say about one quantized linear."""

    bits: int
    zero_point: bool
    strategy: str  # "group" or "channel"
    group_size: int | None
    format: str
    activations: str | None = None
    # not part of the format: layers of any width share a config group
    in_features: int = field(default=0, compare=False)

    @classmethod
    def of(cls, qw: QuantizedWeight) -> LayerFormat:
        return cls.planned(qw.scheme, qw.group_size, qw.shape[1], qw.activations)

    @classmethod
    def of_any(cls, layer: QuantizedWeight | LayerFormat) -> LayerFormat:
        """A quantized weight's format, or a planned one as it is."""
        return layer if isinstance(layer, LayerFormat) else cls.of(layer)

    @property
    def stored_group(self) -> int:
        """Inputs per scale: the group, or the whole row for a per-channel layer."""
        return self.group_size or self.in_features

    @classmethod
    def planned(cls, scheme, group_size: int, in_features: int, activations: str | None):
        """The format of a layer before it is quantized (for warnings before any work)."""
        channel = group_size == in_features
        return cls(
            bits=scheme.bits,
            zero_point=scheme.zero_point,
            strategy="channel" if channel else "group",
            group_size=None if channel else group_size,
            format=storage_format(activations),
            activations=activations,
            in_features=in_features,
        )

    def weight_args(self) -> dict:
        args = {
            "num_bits": self.bits,
            "type": "int",
            "symmetric": not self.zero_point,
            "strategy": self.strategy,
            "dynamic": False,
            "observer": "minmax",
        }
        if self.group_size is not None:
            args["group_size"] = self.group_size
        return args

    def input_args(self) -> dict | None:
        if self.activations != "int8-token":
            return None
        return {
            "num_bits": 8,
            "type": "int",
            "symmetric": True,
            "strategy": "token",
            "dynamic": True,
        }


def encode(prefix: str, qw: QuantizedWeight, outliers: bool = True) -> dict[str, torch.Tensor]:
    """Tensors stored for one quantized linear named `prefix` (`outliers`: with its 16-bit
    columns, if any)."""
    fmt = storage_format(qw.activations)
    out = {f"{prefix}.weight_scale": qw.scale.contiguous()}
    if fmt == PACKED:
        out[f"{prefix}.weight_packed"] = pack(qw.q, qw.scheme.bits, dim=1)
        out[f"{prefix}.weight_shape"] = torch.tensor(list(qw.shape), dtype=torch.int64)
        if qw.zero_point is not None:
            out[f"{prefix}.weight_zero_point"] = pack(qw.zero_point, qw.scheme.bits, dim=0)
    else:
        out[f"{prefix}.weight"] = qw.q.contiguous()
        if qw.zero_point is not None:
            out[f"{prefix}.weight_zero_point"] = qw.zero_point.contiguous()
    if outliers and qw.outlier_index is not None:
        out[f"{prefix}.{OUTLIER_INDEX}"] = qw.outlier_index.to(torch.int32).contiguous()
        out[f"{prefix}.{OUTLIER_WEIGHT}"] = qw.outlier_weight.contiguous()
    return out


def decode_codes(prefix: str, tensors: dict[str, torch.Tensor], args: dict, fmt: str):
    """The integer codes of `prefix` as stored: (q int8 [out, in], scale, zero point or
    None, group size), for readers that keep weights quantized (the runtime)."""
    bits = args["num_bits"]
    scale = tensors[f"{prefix}.weight_scale"]
    zp = tensors.get(f"{prefix}.weight_zero_point")
    if fmt == PACKED:
        shape = tuple(int(s) for s in tensors[f"{prefix}.weight_shape"].tolist())
        q = unpack(tensors[f"{prefix}.weight_packed"], bits, shape, dim=1)
        if zp is not None:
            zp = unpack(zp, bits, (shape[0], scale.shape[1]), dim=0)
    else:
        q = tensors[f"{prefix}.weight"]
    return q, scale, zp, args.get("group_size") or q.shape[1]


def device_tensors(prefix: str, tensors: dict[str, torch.Tensor], args: dict):
    """The stored tensors as GPU kernels read them: (weight, scale, zero point, group,
    bits, in_features), the weight as packed int32 words (int4) or bytes (int8); None where
    they cannot (outlier columns, other bit widths)."""
    if f"{prefix}.{OUTLIER_INDEX}" in tensors:
        return None  # outlier columns: the dense path keeps them exact
    bits = args["num_bits"]
    scale = tensors[f"{prefix}.weight_scale"]
    zp = tensors.get(f"{prefix}.weight_zero_point")
    if args["format"] == PACKED:
        if bits not in (4, 8):
            return None
        weight = tensors[f"{prefix}.weight_packed"]
        shape = tuple(int(s) for s in tensors[f"{prefix}.weight_shape"].tolist())
        in_features = shape[1]
        if zp is not None:
            zp = unpack(zp, bits, (shape[0], scale.shape[1]), dim=0)
        if bits == 8:  # the int8 kernel reads one byte per weight
            weight = unpack(weight, 8, shape, dim=1)
    else:
        weight = tensors[f"{prefix}.weight"]
        in_features = weight.shape[1]
    return weight, scale, zp, args.get("group_size") or in_features, bits, in_features


def stored_layers(qc: dict, tensors: dict[str, torch.Tensor]) -> dict[str, dict]:
    """{prefix: weight args + the group's storage `format`} for every linear with
    quantized tensors, matched to its config group."""
    prefixes = sorted(k[: -len(".weight_scale")] for k in tensors if k.endswith(".weight_scale"))
    layers = {}
    for prefix in prefixes:
        for group in qc["config_groups"].values():
            if target_matches(prefix, group["targets"]):
                layers[prefix] = {**group["weights"], "format": group.get("format") or qc["format"]}
                check_shapes(prefix, tensors, layers[prefix])
                break
        else:
            raise LlmpressError(
                f"{prefix} has quantized tensors but no config group targets it: config.json "
                "does not match the weights; re-export the artifact"
            )
    return layers


def check_shapes(prefix: str, tensors: dict[str, torch.Tensor], args: dict) -> None:
    """Refuse stored tensors that do not hold the matrix the config describes: a truncated
    `weight_packed` would otherwise be padded with zeros and compute a different model."""
    bits = args["num_bits"]

    def need(name: str) -> torch.Tensor:
        t = tensors.get(f"{prefix}.{name}")
        if t is None:
            raise LlmpressError(f"{prefix}.{name} is missing: the artifact is damaged; re-make it")
        return t

    if args["format"] == PACKED:
        shape = need("weight_shape").tolist()
        if len(shape) != 2 or min(shape) < 1:
            raise LlmpressError(
                f"{prefix}.weight_shape is {shape}, not a matrix's [rows, columns]: the "
                "artifact is damaged; re-create it"
            )
        rows, cols = shape
        _expect(prefix, "weight_packed", need("weight_packed"), (rows, _words(cols, bits)))
    else:
        rows, cols = need("weight").shape
    groups = math.ceil(cols / (args.get("group_size") or cols))
    _expect(prefix, "weight_scale", need("weight_scale"), (rows, groups))
    zp = tensors.get(f"{prefix}.weight_zero_point")
    if zp is not None:
        zp_rows = _words(rows, bits) if args["format"] == PACKED else rows
        _expect(prefix, "weight_zero_point", zp, (zp_rows, groups))


def _words(values: int, bits: int) -> int:
    return math.ceil(values * bits / 32)


def _expect(prefix: str, name: str, t: torch.Tensor, shape: tuple[int, int]) -> None:
    if tuple(t.shape) != tuple(shape):
        raise LlmpressError(
            f"{prefix}.{name} has shape {list(t.shape)} where its weight_shape and group "
            f"size need {list(shape)}: the artifact is damaged; re-create it"
        )


def _compact_targets(names: list[str], block_names: dict[str, list[str]]) -> list[str]:
    """Exact module names, with a regex in place of every block linear kind fully covered."""
    chosen = set(names)
    targets: list[str] = []
    for suffix, members in block_names.items():
        if members and set(members) <= chosen:
            targets.append("re:.*" + re.escape("." + suffix) + "$")
            chosen -= set(members)
    return targets + sorted(chosen)


def quantization_config(
    layers: dict[str, QuantizedWeight | LayerFormat],
    block_names: dict[str, list[str]],
    ignore: list[str],
    aliases: dict[str, str] | None = None,
) -> dict:
    """config.json's `quantization_config`: one config group per distinct layer format
    (`layers` maps names to quantized weights, or to planned formats). `aliases`: a
    module's other name, targeted beside it (a head transformers loads under its own).

    `block_names` maps each block-linear kind (e.g. "self_attn.q_proj") to every module of
    that kind, so a scheme shared by all of them is written as one regex target.
    """
    by_format: dict[LayerFormat, list[str]] = {}
    for name, qw in layers.items():
        lf = LayerFormat.of_any(qw)
        by_format.setdefault(lf, []).append(name)
    formats = {lf.format for lf in by_format}
    groups = {}
    for i, (lf, names) in enumerate(
        sorted(by_format.items(), key=lambda kv: (kv[0].bits, kv[0].group_size or 0))
    ):
        targets = _compact_targets(names, block_names)
        targets += [aliases[n] for n in names if n in (aliases or {})]
        groups[f"group_{i}"] = {
            "targets": targets,
            "weights": lf.weight_args(),
            "input_activations": lf.input_args(),
            "output_activations": None,
            "format": lf.format,
        }
    return {
        "quant_method": "compressed-tensors",
        "format": formats.pop() if len(formats) == 1 else MIXED,
        "quantization_status": "compressed",
        "config_groups": groups,
        "ignore": ignore,
        "kv_cache_scheme": None,
    }


def target_matches(name: str, targets: list[str]) -> bool:
    for t in targets:
        if t.startswith("re:"):
            if re.match(t[3:], name):
                return True
        elif t == name:
            return True
    return False
