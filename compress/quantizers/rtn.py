"""Round-to-nearest weight quantization: the baseline every other method is measured against."""

from __future__ import annotations

from dataclasses import dataclass

from compress.quantizers.preflight import check_layers
from compress.quantizers.scheme import (
    AUTO,
    DEFAULT_ZERO_POINT,
    QuantScheme,
    default_group_size,
    quantize_weight,
    resolve_auto,
)
from compress.stage import BlockContext, Described, Workspace, register_stage

RTN_FLOPS_PER_WEIGHT = 1500  # FLOP-equivalents of rounding one weight (compress/estimate.py)


@dataclass(frozen=True)
class RTNConfig:
    bits: int = 4
    group_size: int | None = AUTO  # 64 below 8 bits, per-channel at 8 (scheme.py)
    zero_point: bool = DEFAULT_ZERO_POINT

    @property
    def scheme(self) -> QuantScheme:
        return QuantScheme(self.bits, self.group_size, self.zero_point)

    def __post_init__(self) -> None:
        resolve_auto(self, group_size=default_group_size(self.bits))
        self.scheme  # noqa: B018 - validates bits and group size as the recipe is read


def adjusted_groups(
    groups: dict[str, int], scheme: QuantScheme, schemes: dict[str, QuantScheme]
) -> dict[str, int]:
    """Layers whose input width the requested group size does not divide (see scheme.py);
    `schemes` holds the layers mixed precision gave another scheme."""
    adjusted = {}
    for name, g in groups.items():
        wanted = schemes.get(name, scheme).group_size
        if wanted and g != wanted:
            adjusted[name] = g
    return adjusted


@register_stage("rtn", RTNConfig)
class RTN(Described):
    @staticmethod
    def weight_bits(settings: dict) -> int | None:
        return settings.get("bits")

    per_layer_schemes = True
    activations = None
    needs_calibration = False

    def work(self, load) -> float:
        # elementwise rounding: 1.5 s for the default model's 106M block weights
        return RTN_FLOPS_PER_WEIGHT * load.block_weights

    def __init__(self, config: RTNConfig):
        self.config = config
        self.groups: dict[str, int] = {}

    @property
    def scheme(self) -> QuantScheme:
        return self.config.scheme

    def preflight(self, ws: Workspace) -> None:
        check_layers(ws, self.config.scheme)

    def calibrate(self, ctx: BlockContext) -> None:
        """RTN looks only at the weights."""

    def transform(self, ctx: BlockContext) -> None:
        for rel in ctx.targets():
            scheme = ctx.scheme(rel, self.config.scheme)
            qw = quantize_weight(ctx.sub(rel).weight.detach(), scheme, ctx.ws.storage_dtype)
            ctx.set_quantized(rel, qw)
            self.groups[f"{ctx.prefix}.{rel}"] = qw.group_size

    def export(self, ws: Workspace) -> dict:
        scheme = self.config.scheme
        return {
            "stage": "rtn",
            "scheme": scheme.label(),
            "layers": len(self.groups),
            "group_size_adjusted": adjusted_groups(self.groups, scheme, ws.schemes),
        }
