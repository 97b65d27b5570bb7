"""Round-to-nearest weight quantization: the baseline every other method is measured against."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from compress.quantizers.scheme import QuantScheme, quantize_weight
from compress.stage import Workspace, register_stage


@dataclass(frozen=True)
class RTNConfig:
    bits: int = 4
    group_size: int | None = 64
    zero_point: bool = True

    @property
    def scheme(self) -> QuantScheme:
        return QuantScheme(self.bits, self.group_size, self.zero_point)

    def __post_init__(self) -> None:
        self.scheme  # noqa: B018 - validates bits and group size as the recipe is read


@register_stage("rtn", RTNConfig)
class RTN:
    needs_calibration = False

    def __init__(self, config: RTNConfig):
        self.config = config
        self.groups: dict[str, int] = {}

    def calibrate(self, ws: Workspace, samples: torch.Tensor | None) -> None:
        """RTN looks only at the weights."""

    def transform(self, ws: Workspace) -> None:
        scheme = self.config.scheme
        for name in tqdm(ws.target_linears(), desc="rtn", unit="linear", leave=False):
            qw = quantize_weight(ws.linear(name).weight.detach(), scheme, ws.storage_dtype)
            ws.set_quantized(name, qw)
            self.groups[name] = qw.group_size

    def export(self, ws: Workspace) -> dict:
        scheme = self.config.scheme
        requested = scheme.group_size
        return {
            "stage": "rtn",
            "scheme": scheme.label(),
            "layers": len(self.groups),
            # layers whose input width the requested group does not divide (see scheme.py)
            "group_size_adjusted": {
                n: g for n, g in self.groups.items() if requested and g != requested
            },
        }
