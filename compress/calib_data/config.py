"""The recipe's `calib:` block: where calibration text comes from and how it is cut."""

from __future__ import annotations

from dataclasses import dataclass

from compress.errors import LlmpressError

# Calibration keeps every sample's hidden states in memory (samples × length × width ×
# 4 bytes, twice over): 2^20 tokens, 16 times the default 128 × 512, is 2.4 GB per copy
# at the default model's width and 17 GB at a 7B model's, beyond which no method gains.
MAX_TOKENS = 1 << 20


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
        if self.samples * self.length > MAX_TOKENS:
            raise LlmpressError(
                f"{self.samples} samples × {self.length} tokens is "
                f"{self.samples * self.length:,} tokens, over the {MAX_TOKENS:,} calibration "
                "can hold in memory: lower --calib-samples or --calib-len (default 128 × 512)"
            )
