"""The recipe's `calib:` block: where calibration text comes from and how it is cut."""

from __future__ import annotations

from dataclasses import dataclass

from compress.errors import LlmpressError


@dataclass(frozen=True)
class CalibConfig:
    """Where calibration text comes from and how it is cut into token samples."""

    source: str = "self"
    samples: int = 128
    length: int = 512
    seed: int = 0
    text_field: str = "text"

    def __post_init__(self) -> None:
        if self.samples < 1 or self.length < 2:
            raise LlmpressError("calib: samples must be >= 1 and length >= 2")
