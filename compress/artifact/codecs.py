"""Storage formats as codecs, registered once by the name a recipe's `export` uses.

A codec owns everything about its format: what it refuses before any work, the tensors
it writes per quantized linear and their names, the config.json block, how a reader
recognizes it, and how the stored tensors decode, to integer codes for the runtime and to
floats for the dense loader. The layouts themselves are written out in ct_format.py
(compressed-tensors) and awq_format.py (AutoAWQ GEMM).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from compress.artifact import awq_format, ct_format
from compress.errors import LlmpressError
from compress.quantizers.scheme import QuantizedWeight, QuantScheme


def _stored(q, scale, zero_point, group: int, bits: int, index=None, outlier=None):
    """A stored linear as the quantizers' own QuantizedWeight: what readers decode to."""
    scheme = QuantScheme(bits, group, zero_point is not None)
    return QuantizedWeight(q, scale, zero_point, scheme, group, index, outlier)


class CompressedTensors:
    """What transformers and vLLM read (ct_format.py). With `outliers` (export `auto`),
    LLM.int8()-style layers also store their 16-bit columns, which llmpress runs and
    other readers ignore or refuse (engines.py says which)."""

    family = "compressed-tensors"
    storage_dtype: torch.dtype | None = None  # the recipe's dtype is kept
    holds_lm_head = True
    per_layer_schemes = True  # one config group per scheme (mixed precision)
    suffixes = (*ct_format.SUFFIXES, *ct_format.OUTLIER_SUFFIXES)

    def __init__(self, name: str, outliers: bool):
        self.name, self.outliers = name, outliers

    def check_scheme(self, stage: str, scheme: QuantScheme | None) -> None:
        """Every scheme fits."""

    def preflight(self, widths: Iterable[int], schemes: list) -> None:
        """Every scheme and width fits."""

    def encode(self, prefix: str, qw: QuantizedWeight) -> dict[str, torch.Tensor]:
        return ct_format.encode(prefix, qw, outliers=self.outliers)

    def config(self, layers: dict, block_names: dict, ignore: list[str]) -> dict:
        return ct_format.quantization_config(layers, block_names, ignore)

    @staticmethod
    def reads(qc: dict) -> bool:
        return qc.get("quant_method") == "compressed-tensors"

    @staticmethod
    def bits(qc: dict) -> set[int]:
        """The weight bit widths of the config groups written."""
        return {g["weights"]["num_bits"] for g in qc["config_groups"].values()}

    @staticmethod
    def layers(config: dict, tensors: dict) -> dict[str, dict]:
        """{prefix: weight args, with the group's storage `format`} of every quantized linear."""
        return ct_format.stored_layers(config["quantization_config"], tensors)

    @staticmethod
    def decode(prefix: str, tensors: dict, args: dict) -> QuantizedWeight:
        q, scale, zp, group = ct_format.decode_codes(prefix, tensors, args, args["format"])
        return _stored(
            q, scale, zp, group, args["num_bits"],
            tensors.get(f"{prefix}.{ct_format.OUTLIER_INDEX}"),
            tensors.get(f"{prefix}.{ct_format.OUTLIER_WEIGHT}"),
        )  # fmt: skip

    @staticmethod
    def device_tensors(prefix: str, tensors: dict, args: dict):
        """For the GPU kernels, which read this layout as stored: (weight, scale, zero
        point, group, bits, in_features), or None where they cannot (outlier columns, bits
        other than 4 and 8)."""
        return ct_format.device_tensors(prefix, tensors, args)


class AwqGemm:
    """AutoAWQ's GEMM layout (awq_format.py), for engines that read only that: 4-bit with
    zero points, float16 scales, one group size, no quantized lm_head."""

    name = family = "awq-gemm"
    storage_dtype = torch.float16  # AutoAWQ's kernels read float16 scales
    holds_lm_head = False
    per_layer_schemes = False
    suffixes = awq_format.SUFFIXES

    def check_scheme(self, stage: str, scheme: QuantScheme | None) -> None:
        """Refuse, when the recipe is read, a scheme this layout cannot hold, rather than
        store another one than was asked for (a symmetric request silently given a zero
        point would leave the card's command naming a scheme the artifact does not have)."""
        if scheme is None or (scheme.bits == 4 and scheme.zero_point):
            return
        if scheme.bits == 4:
            problem = "is symmetric"
            fix = f"{stage}:{QuantScheme(4, scheme.group_size, True).label()}"
        else:
            problem, fix = f"is {scheme.bits}-bit", "a 4-bit one such as awq:w4g64zp"
        raise LlmpressError(
            f"the awq-gemm export holds only 4-bit weights with a zero point, and "
            f"{stage}:{scheme.label()} {problem}: ask for {fix} (in a recipe: bits: 4, "
            "zero_point: true), or drop --export awq-gemm to keep this scheme in the "
            "compressed-tensors layout"
        )

    def preflight(self, widths: Iterable[int], schemes: list) -> None:
        groups = set()
        widths = list(widths)
        for scheme in schemes:
            if scheme.bits != 4 or not scheme.zero_point:
                raise LlmpressError(
                    f"the awq-gemm export holds only 4-bit weights with a zero point, not "
                    f"{scheme.label()}; use the default compressed-tensors export"
                )
            groups |= {scheme.group_for(width) for width in widths}
        if len(groups) > 1:
            raise LlmpressError(
                f"layers would use group sizes {sorted(groups)} (widths the requested group "
                "does not divide) but the awq-gemm layout has one group size: pick one that "
                "divides every layer (e.g. 64 or 32) or use the compressed-tensors export"
            )

    def encode(self, prefix: str, qw: QuantizedWeight) -> dict[str, torch.Tensor]:
        return awq_format.encode_awq(prefix, qw)

    def config(self, layers: dict, block_names: dict, ignore: list[str]) -> dict:
        """One group size for every layer (preflight refused others). A layer whose width
        equals the group has one group per row: per-channel in compressed-tensors' terms,
        the same group here."""
        groups = {ct_format.LayerFormat.of_any(qw).stored_group for qw in layers.values()}
        if len(groups) != 1:
            raise LlmpressError(
                f"layers use group sizes {sorted(groups)} but the awq-gemm layout has one: "
                "pick a group size that divides every layer, or use the compressed-tensors export"
            )
        return awq_format.awq_config(groups.pop(), ignore)

    @staticmethod
    def reads(qc: dict) -> bool:
        return qc.get("quant_method") == "awq"

    @staticmethod
    def bits(qc: dict) -> set[int]:
        return {qc["bits"]}

    @staticmethod
    def layers(config: dict, tensors: dict) -> dict[str, dict]:
        qc = config["quantization_config"]
        if qc.get("version", "gemm").lower() != "gemm" or qc.get("bits") != 4:
            raise LlmpressError("llmpress reads AWQ checkpoints in the 4-bit GEMM layout only")
        prefixes = sorted(k[: -len(".qweight")] for k in tensors if k.endswith(".qweight"))
        return {p: {"group_size": qc["group_size"]} for p in prefixes}

    @staticmethod
    def decode(prefix: str, tensors: dict, args: dict) -> QuantizedWeight:
        return _stored(*awq_format.awq_codes(prefix, tensors, args["group_size"]), bits=4)

    @staticmethod
    def device_tensors(prefix: str, tensors: dict, args: dict):
        return None  # the GPU kernels read compressed-tensors words; decode for them


CODECS = {
    "auto": CompressedTensors("auto", outliers=True),
    "compressed-tensors": CompressedTensors("compressed-tensors", outliers=False),
    "awq-gemm": AwqGemm(),
}
EXPORTS = tuple(CODECS)
ALL_SUFFIXES = frozenset(s for c in CODECS.values() for s in c.suffixes)


def codec(export: str):
    """The codec a recipe's `export` names."""
    if export not in CODECS:
        raise LlmpressError(f"recipe: export {export!r} is not one of {', '.join(EXPORTS)}")
    return CODECS[export]


def reading_codec(config: dict):
    """The codec that reads a checkpoint's config.json (None: a dense checkpoint)."""
    qc = config.get("quantization_config")
    if not qc:
        return None
    for c in (CODECS["auto"], CODECS["awq-gemm"]):
        if c.reads(qc):
            return c
    raise LlmpressError(
        f"quantization method {qc.get('quant_method')!r} is not supported: llmpress reads "
        "compressed-tensors checkpoints and dense ones"
    )


def stored_bits(config: dict) -> list[int]:
    """The weight bit widths a checkpoint's config.json says it stores (none: dense)."""
    c = reading_codec(config)
    return sorted(c.bits(config["quantization_config"])) if c else []
