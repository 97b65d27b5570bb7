"""The compressed-tensors codec: what transformers and vLLM read (layout: ct_layout.py,
their loaders' rules: ct_engines.py)."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable

import torch

from compress.artifact.formats import ct_engines, ct_layout
from compress.artifact.formats.stored import stored
from compress.quantizers.scheme import QuantizedWeight, QuantScheme


class CompressedTensors:
    """With `outliers` (export `auto`), LLM.int8()-style layers also store their 16-bit
    columns, which llmpress runs and other readers ignore or refuse (ct_engines.py says
    which)."""

    family = hub_tag = "compressed-tensors"
    storage_dtype: torch.dtype | None = None  # the recipe's dtype is kept
    holds_lm_head = True
    per_layer_schemes = True  # one config group per scheme (mixed precision)
    suffixes = (*ct_layout.SUFFIXES, *ct_layout.OUTLIER_SUFFIXES)
    package = "compressed-tensors"  # what transformers needs to read it

    def __init__(self, name: str, outliers: bool):
        self.name, self.outliers = name, outliers
        self.summary = (
            "compressed-tensors, which transformers and vLLM read, with LLM.int8() outlier "
            "columns where an int8 stage kept them"
            if outliers
            else "compressed-tensors alone (no outlier columns)"
        )

    # writing

    def check_scheme(self, stage: str, scheme: QuantScheme | None) -> None:
        """Every scheme fits."""

    def preflight(self, widths: Iterable[int], schemes: list) -> None:
        """Every scheme and width fits."""

    def encode(self, prefix: str, qw: QuantizedWeight) -> dict[str, torch.Tensor]:
        return ct_layout.encode(prefix, qw, outliers=self.outliers)

    def config(self, layers: dict, block_names: dict, ignore: list[str], aliases=None) -> dict:
        return ct_layout.quantization_config(layers, block_names, ignore, aliases)

    def planned_tensor_names(self, outlier_layers: bool) -> list[str]:
        """Names of the tensors beyond the scheme's own that a layer will store (for the
        engines' verdicts before any work): the outlier columns where kept."""
        return (
            [f"x.{s}" for s in ct_layout.OUTLIER_SUFFIXES]
            if self.outliers and outlier_layers
            else []
        )

    # reading

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
        return ct_layout.stored_layers(config["quantization_config"], tensors)

    @staticmethod
    def decode(prefix: str, tensors: dict, args: dict) -> QuantizedWeight:
        q, scale, zp, group = ct_layout.decode_codes(prefix, tensors, args, args["format"])
        return stored(
            q, scale, zp, group, args["num_bits"],
            tensors.get(f"{prefix}.{ct_layout.OUTLIER_INDEX}"),
            tensors.get(f"{prefix}.{ct_layout.OUTLIER_WEIGHT}"),
        )  # fmt: skip

    @staticmethod
    def device_tensors(prefix: str, tensors: dict, args: dict):
        """For the GPU kernels, which read this layout as stored: (weight, scale, zero
        point, group, bits, in_features), or None where they cannot (outlier columns, bits
        other than 4 and 8)."""
        return ct_layout.device_tensors(prefix, tensors, args)

    @staticmethod
    def token_int8_layers(ckpt) -> dict[str, torch.Tensor]:
        """Linears whose inputs are quantized per token at run time (W8A8), each with its
        outlier columns (empty where none were kept)."""
        from compress.model.loading import read_tensors

        token = [
            g
            for g in ct_engines.groups(ckpt.config)
            if (g.get("input_activations") or {}).get("strategy") == "token"
        ]
        if not token:
            return {}
        index = f".{ct_layout.OUTLIER_INDEX}"
        names = [n for n in ckpt.tensors if n.endswith(index)]
        outliers = {n.removesuffix(index): t for n, t in read_tensors(ckpt, names).items()}
        scaled = sorted(
            n.removesuffix(".weight_scale") for n in ckpt.tensors if n.endswith(".weight_scale")
        )
        return {
            p: outliers.get(p, torch.empty(0, dtype=torch.int32))
            for p in scaled
            if any(ct_layout.target_matches(p, g["targets"]) for g in token)
        }

    @staticmethod
    def describe(qc: dict) -> list[str]:
        """`inspect`'s lines: the format and each config group's scheme and targets."""
        lines = [f"format: {qc['quant_method']} / {qc['format']}"]
        for name, group in qc["config_groups"].items():
            w = group["weights"]
            scheme = f"int{w['num_bits']} {w['strategy']}"
            if w.get("group_size"):
                scheme += f" {w['group_size']}"
            scheme += " symmetric" if w["symmetric"] else " zero-point"
            lines.append(f"  {name}: {scheme} -> {', '.join(group['targets'])}")
        return lines

    # engines

    vllm_problems = staticmethod(ct_engines.vllm_problems)
    transformers_problems = staticmethod(ct_engines.transformers_problems)
    transformers_route = staticmethod(ct_engines.transformers_route)

    def transformers_kwargs(self, route: dict) -> dict:
        """`from_pretrained`'s keyword arguments for a `route` (transformers_route's)."""
        if importlib.util.find_spec("compressed_tensors") is None:
            raise ModuleNotFoundError(f"no module {self.package}", name=self.package)
        from transformers import CompressedTensorsConfig

        return {"quantization_config": CompressedTensorsConfig(**route)} if route else {}

    def transformers_code(self, path: str, problems: list[str], route: dict) -> list[str]:
        """The model card's lines that open it in transformers."""
        if not problems:
            return [
                f"from transformers import AutoModelForCausalLM  # + pip install {self.package}",
                f"model = AutoModelForCausalLM.from_pretrained({path})",
            ]
        if route:
            return [
                "# zero-point weights: transformers 5 loads them dequantized (docs/format.md)",
                "from transformers import AutoModelForCausalLM, CompressedTensorsConfig",
                "model = AutoModelForCausalLM.from_pretrained(",
                f"    {path}, quantization_config=CompressedTensorsConfig(dequantize=True)",
                ")",
            ]
        return [f"# transformers cannot load this artifact: {problems[0]}"]


CODECS = (
    CompressedTensors("auto", outliers=True),
    CompressedTensors("compressed-tensors", outliers=False),
)
