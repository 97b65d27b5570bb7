"""The one interface every compression method plugs into: calibrate → transform → export.

A stage is constructed from its config dataclass (validated when the recipe is read),
may look at calibration samples, changes the workspace, and returns a record of what
it did for the manifest. The pipeline knows nothing about any particular method.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import torch

from compress.model.adapters import Adapter
from compress.quantizers.scheme import QuantizedWeight


@dataclass
class Workspace:
    """The model being compressed and what stages have decided about it so far.

    `model` always computes what the artifact will compute: a stage that quantizes a
    weight records the integers in `quantized` and writes their dequantized values into
    the model, so later stages calibrate on the already-compressed model.
    """

    model: torch.nn.Module
    adapter: Adapter
    config: dict
    tokenizer: Any
    storage_dtype: torch.dtype = torch.float32
    ignore: tuple[str, ...] = ()
    quantized: dict[str, QuantizedWeight] = field(default_factory=dict)

    @property
    def num_layers(self) -> int:
        return int(self.config["num_hidden_layers"])

    def target_linears(self) -> list[str]:
        """Block linears that stages may compress, minus the recipe's `ignore` patterns."""
        return [n for n in self.adapter.linear_names(self.num_layers) if not self.ignored(n)]

    def ignored(self, name: str) -> bool:
        for pattern in self.ignore:
            if pattern.startswith("re:"):
                if re.fullmatch(pattern[3:], name):
                    return True
            elif fnmatch.fnmatchcase(name, pattern):
                return True
        return False

    def linear(self, name: str) -> torch.nn.Linear:
        return self.model.get_submodule(name)

    def set_quantized(self, name: str, qw: QuantizedWeight) -> None:
        module = self.linear(name)
        if tuple(qw.shape) != tuple(module.weight.shape):
            raise ValueError(f"{name}: quantized shape {tuple(qw.shape)} != weight shape")
        self.quantized[name] = qw
        with torch.no_grad():
            module.weight.copy_(qw.dequantize(module.weight.dtype))


class Stage(Protocol):
    """One step of a recipe. `needs_calibration` tells the pipeline to prepare samples."""

    name: ClassVar[str]
    needs_calibration: ClassVar[bool]

    def calibrate(self, ws: Workspace, samples: torch.Tensor | None) -> None: ...

    def transform(self, ws: Workspace) -> None: ...

    def export(self, ws: Workspace) -> dict: ...


@dataclass(frozen=True)
class StageEntry:
    config_type: type
    factory: Any  # Callable[[config], Stage]


STAGES: dict[str, StageEntry] = {}


def register_stage(name: str, config_type: type):
    """Class decorator: make a stage available to recipes under `name`."""

    def wrap(cls):
        cls.name = name
        STAGES[name] = StageEntry(config_type, cls)
        return cls

    return wrap
