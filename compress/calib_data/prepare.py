"""Turn a recipe's `calib` settings into the [samples, length] token tensor stages calibrate on."""

from __future__ import annotations

from collections.abc import Callable

import torch

from compress.calib_data.generated import self_generated
from compress.calib_data.samples import calibration_samples
from compress.calib_data.sources import SELF
from compress.calib_data.token_cache import source_stream


def load_calibration(
    cfg, tokenizer, load_model: Callable, cache_key: str | None = None, writer=None
) -> torch.Tensor:
    """Samples from `cfg.source`; `self` has the original model write them (cached), by
    `writer` first when given (generated.self_generated)."""
    if cfg.source == SELF:
        return self_generated(
            load_model, tokenizer, cfg.samples, cfg.length, cfg.seed, cache_key, writer
        )
    stream = source_stream(tokenizer, cfg.source, cfg.text_field)
    return calibration_samples(stream, cfg.samples, cfg.length, cfg.seed)
