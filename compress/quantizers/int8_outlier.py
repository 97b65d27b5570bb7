"""LLM.int8()-style int8 weights with outlier input channels kept in 16-bit.

Dettmers et al. (2022) found that a few input features carry activations far larger
than the rest, and that int8 matmuls break on them. bitsandbytes finds them at run
time, per batch; here they are found once, in calibration: for every linear, the largest
|activation| per input channel over all calibration tokens. Channels above `threshold`
(6.0, the paper's), or the `top_k` / `fraction` largest per layer, are outliers: their
weight columns are kept in 16-bit beside a plain int8 weight (symmetric, per output row
or per group). The layer computes x[:, regular] · dequant(W_int8)ᵀ + x[:, outliers] · W_16ᵀ;
with `activations: int8` the regular part of x is also quantized per token at run time
(W8A8, the paper's mixed-precision decomposition). The int8 weight is an ordinary
compressed-tensors int8 weight, so a reader that ignores the outlier columns still runs
plain int8 correctly.
"""

from __future__ import annotations

import dataclasses

import torch

from compress.artifact.dense import decompose
from compress.distributed import all_max
from compress.errors import LlmpressError
from compress.quantizers.preflight import check_layers
from compress.quantizers.scheme import (
    AUTO,
    DEFAULT_GROUP_SIZE,
    QuantScheme,
    quantize_weight,
    resolve_auto,
)
from compress.stage import BlockContext, Described, Figure, Workspace, register_stage

DEFAULT_FRACTION = 0.01  # the best measured: top 1% of input channels per layer
ACTIVATIONS = ("none", "int8")


@dataclasses.dataclass(frozen=True)
class Int8OutlierConfig:
    """Outliers: `threshold` (the paper's 6.0), `top_k`, or `fraction` (default 1%) of the
    input channels per layer. Weights: groups of 64 (the best measured, KL 0.00073 with
    0.9% of columns in 16-bit) or per output row (`group_size: null`, the default with
    int8 activations, which vLLM's W8A8 kernels need)."""

    threshold: float | None = None
    top_k: int | None = None
    fraction: float | None = None  # DEFAULT_FRACTION when none of the three is set
    group_size: int | None = AUTO
    activations: str = "none"  # "int8": dynamic per-token int8 activations (W8A8)

    def __post_init__(self) -> None:
        chosen = [k for k in ("threshold", "top_k", "fraction") if getattr(self, k) is not None]
        if len(chosen) > 1:
            raise LlmpressError(f"int8: set one of threshold, top_k, fraction, not {chosen}")
        if not chosen:
            object.__setattr__(self, "fraction", DEFAULT_FRACTION)
        if self.fraction is not None and not 0 <= self.fraction < 1:
            raise LlmpressError("int8: fraction must be in [0, 1)")
        if self.activations not in ACTIVATIONS:
            raise LlmpressError(f"int8: activations must be one of {', '.join(ACTIVATIONS)}")
        resolve_auto(self, group_size=None if self.activations == "int8" else DEFAULT_GROUP_SIZE)
        self.scheme  # noqa: B018 - validates the group size

    @property
    def scheme(self) -> QuantScheme:
        return QuantScheme(8, self.group_size, False)

    def select(self, amax: torch.Tensor) -> torch.Tensor:
        """Indices (sorted) of the outlier channels given per-channel max |activation|."""
        if self.threshold is not None:
            idx = torch.nonzero(amax > self.threshold).flatten()
        else:
            k = self.top_k if self.top_k is not None else int(self.fraction * amax.numel())
            k = min(k, amax.numel())
            idx = amax.topk(k).indices if k else amax.new_empty(0, dtype=torch.long)
        return idx.sort().values.to(torch.int32)


def outlier_dtype(storage: torch.dtype) -> torch.dtype:
    """16-bit for the kept columns: bf16 for bf16 models, fp16 otherwise (more mantissa)."""
    return torch.bfloat16 if storage == torch.bfloat16 else torch.float16


@register_stage("int8", Int8OutlierConfig)
class Int8Outlier(Described):
    tags = ("int8", "llm.int8")

    @staticmethod
    def weight_bits(settings: dict) -> int | None:
        return 8

    @staticmethod
    def summary(record: dict) -> str | None:
        """Outlier input channels kept in 16-bit, in total and for the layers with the most."""
        per_layer = sorted(record["outliers"].items(), key=lambda kv: -len(kv[1]))
        top = ", ".join(f"{name} {len(idx)}" for name, idx in per_layer[:5])
        return (
            f"int8 outliers: {record['outlier_columns']} input columns kept in 16-bit "
            f"({100 * record['outlier_share']:.2f}%); most in: {top}"
        )

    @staticmethod
    def figures(record: dict) -> list[Figure]:
        if not record.get("outliers"):
            return []
        counts = {k: len(v) for k, v in record["outliers"].items()}
        return [
            Figure(
                "Outlier channels per layer", "outliers.png", "per_layer", counts,
                ylabel="input channels kept in 16-bit", zero_label="none",
                plot_title="LLM.int8() outlier channels per layer",
            )
        ]  # fmt: skip

    needs_calibration = True

    def __init__(self, config: Int8OutlierConfig):
        self.config = config
        self.outliers: dict[str, list[int]] = {}
        self.plain_experts = False  # Mixture-of-Experts linears kept plain int8
        self.columns = 0
        self._amax: dict[str, torch.Tensor] = {}

    @property
    def scheme(self) -> QuantScheme:
        return self.config.scheme

    @property
    def activations(self) -> str | None:
        return "int8-token" if self.config.activations == "int8" else None

    def preflight(self, ws: Workspace) -> None:
        check_layers(ws, self.config.scheme)

    def calibrate(self, ctx: BlockContext) -> None:
        amax = {  # allocated before any chunk: a rank may hold no sample
            rel: ctx.sub(rel).weight.new_zeros(ctx.sub(rel).in_features) for rel in ctx.targets()
        }

        def observe(rel: str, x: torch.Tensor) -> None:
            if x.numel():
                amax[rel] = torch.maximum(amax[rel], x.abs().reshape(-1, x.shape[-1]).amax(0))

        ctx.observe(ctx.targets(), observe)
        self._amax = {rel: all_max(m) for rel, m in amax.items()}  # over the ranks

    @torch.no_grad()
    def transform(self, ctx: BlockContext) -> None:
        kept = outlier_dtype(ctx.ws.storage_dtype)
        decomposed = {}
        experts = set(ctx.ws.adapter.expert_linears)
        for rel in ctx.targets():
            w = ctx.sub(rel).weight.detach()
            idx = self.config.select(self._amax[rel])
            if rel in experts:  # transformers merges experts at load and cannot carry them
                idx = idx[:0]
                self.plain_experts = True
            qw = quantize_weight(w, self.config.scheme, ctx.ws.storage_dtype)
            qw.outlier_index = idx
            qw.outlier_weight = w[:, idx.long()].to(kept)
            if self.config.activations == "int8":
                qw.activations = "int8-token"
            ctx.set_quantized(rel, qw)
            name = f"{ctx.prefix}.{rel}"
            self.outliers[name] = idx.tolist()
            self.columns += w.shape[1]
            decomposed[rel] = idx
        if self.config.activations == "int8":  # later blocks calibrate on the W8A8 outputs
            decompose(ctx.module, decomposed)
        self._amax = {}

    def export(self, ws: Workspace) -> dict:
        kept = sum(len(v) for v in self.outliers.values())
        return {
            "stage": "int8",
            "config": dataclasses.asdict(self.config),
            "outlier_columns": kept,
            "outlier_share": round(kept / self.columns, 6) if self.columns else 0.0,
            "outliers": self.outliers,
            **(
                {"experts": "plain int8, no outlier columns (transformers merges experts at load)"}
                if self.plain_experts
                else {}
            ),
        }
