"""The AutoAWQ GEMM codec (layout: awq_layout.py), for engines that read only that, and
what vLLM's AWQ loader takes: under vllm/model_executor/ (engine_rules.py says which
release), layers/quantization/awq.py and awq_marlin.py (4 bits only, "Unsupported
num_bits" otherwise), and layers/quantization/utils/awq_triton.py (Marlin or AWQ's own
Triton kernel on CUDA: groups of 32, 64, 128 or one per row; CPUWNA16 on a CPU)."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from compress.artifact.engine_rules import (
    CPU,
    DEVICES,
    EVEN,
    GPU,
    KERNEL,
    Problem,
    kernel_problem,
    linears,
)
from compress.artifact.formats import awq_layout
from compress.artifact.formats.ct_layout import LayerFormat
from compress.artifact.formats.stored import stored
from compress.errors import LlmpressError
from compress.quantizers.scheme import QuantizedWeight, QuantScheme

BITS = r"Unsupported num_bits"  # vLLM's error for other widths
GROUPS = {GPU: (-1, 32, 64, 128), CPU: EVEN}  # the group sizes its kernels take
NEEDS = "gptqmodel"  # the package transformers reads this layout through
FALLBACK = "compressed-tensors"  # the export that holds what this one cannot


class AwqGemm:
    """4-bit with zero points, float16 scales, one group size, no quantized lm_head."""

    name = family = "awq-gemm"
    hub_tag = "awq"
    summary = "AutoAWQ's GEMM layout, for AWQ-only engines (4-bit, zero point)"
    storage_dtype = torch.float16  # AutoAWQ's kernels read float16 scales
    holds_lm_head = False
    per_layer_schemes = False
    outliers = False
    suffixes = awq_layout.SUFFIXES
    package = NEEDS

    # writing

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
            f"the {self.name} export holds only 4-bit weights with a zero point, and "
            f"{stage}:{scheme.label()} {problem}: ask for {fix} (in a recipe: bits: 4, "
            f"zero_point: true), or drop --export {self.name} to keep this scheme in the "
            f"{FALLBACK} layout"
        )

    def preflight(self, widths: Iterable[int], schemes: list) -> None:
        groups = set()
        widths = list(widths)
        for scheme in schemes:
            if scheme.bits != 4 or not scheme.zero_point:
                raise LlmpressError(
                    f"the {self.name} export holds only 4-bit weights with a zero point, not "
                    f"{scheme.label()}; use the default {FALLBACK} export"
                )
            groups |= {scheme.group_for(width) for width in widths}
        if len(groups) > 1:
            raise LlmpressError(
                f"layers would use group sizes {sorted(groups)} (widths the requested group "
                f"does not divide) but the {self.name} layout has one group size: pick one "
                f"that divides every layer (e.g. 64 or 32) or use the {FALLBACK} export"
            )

    def encode(self, prefix: str, qw: QuantizedWeight) -> dict[str, torch.Tensor]:
        return awq_layout.encode_awq(prefix, qw)

    def config(self, layers: dict, block_names: dict, ignore: list[str], aliases=None) -> dict:
        """One group size for every layer (preflight refused others). A layer whose width
        equals the group has one group per row: per-channel in compressed-tensors' terms,
        the same group here. (`aliases`: the layout names no targets, only `ignore`.)"""
        groups = {LayerFormat.of_any(qw).stored_group for qw in layers.values()}
        if len(groups) != 1:
            raise LlmpressError(
                f"layers use group sizes {sorted(groups)} but the {self.name} layout has one: "
                f"pick a group size that divides every layer, or use the {FALLBACK} export"
            )
        return awq_layout.awq_config(groups.pop(), ignore)

    def planned_tensor_names(self, outlier_layers: bool) -> list[str]:
        return []

    # reading

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
        return stored(*awq_layout.awq_codes(prefix, tensors, args["group_size"]), bits=4)

    @staticmethod
    def device_tensors(prefix: str, tensors: dict, args: dict):
        return None  # the GPU kernels read compressed-tensors words; decode for them

    @staticmethod
    def token_int8_layers(ckpt) -> dict[str, torch.Tensor]:
        return {}  # weight-only by construction

    @staticmethod
    def describe(qc: dict) -> list[str]:
        not_converted = ", ".join(qc.get("modules_to_not_convert") or [])
        return [
            f"format: awq / {qc.get('version')}: int{qc['bits']} group {qc['group_size']} "
            f"zero-point; not converted: {not_converted}"
        ]

    # engines

    @staticmethod
    def vllm_problems(
        config: dict, tensor_names: list[str], device: str, dtype: str
    ) -> tuple[list[Problem], bool]:
        qc = config["quantization_config"]
        bits, gs = qc.get("bits"), qc.get("group_size")
        if bits != 4:
            return [Problem(f"AWQ with {bits} bits: vLLM's AWQ reads 4 bits only", BITS)], False
        ok = gs % 2 == 0 if GROUPS[device] == EVEN else gs in GROUPS[device]
        if not ok:
            return [Problem(f"AWQ with group size {gs}: no {DEVICES[device]} kernel", KERNEL)], True
        if device == CPU:
            skipped = qc.get("modules_to_not_convert") or []
            for lin in linears(config)[:-1]:  # the lm_head stays in 16 bits
                if any(s in lin.name for s in skipped) or lin.k is None:
                    continue
                found = kernel_problem(CPU, 4, True, gs, lin.k, lin.n, dtype)
                if found:
                    return [found], True
        return [], True

    @staticmethod
    def transformers_problems(config: dict) -> list[str]:
        return [f"the AWQ GEMM layout needs the {NEEDS} package"]

    @staticmethod
    def transformers_route(config: dict) -> dict | None:
        return None

    def transformers_kwargs(self, route: dict) -> dict:
        raise LlmpressError(f"transformers reads the {self.name} layout only through {NEEDS}")

    @staticmethod
    def transformers_code(path: str, problems: list[str], route: dict) -> list[str]:
        return [
            f"# AutoAWQ's GEMM layout: transformers reads it through {NEEDS}",
            f"# pip install {NEEDS}",
            "from transformers import AutoModelForCausalLM",
            f"model = AutoModelForCausalLM.from_pretrained({path})",
        ]


CODECS = (AwqGemm(),)
