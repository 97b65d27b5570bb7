"""Turn a recipe's `calib` settings into the [samples, length] token tensor stages calibrate on."""

from __future__ import annotations

import torch

from compress.calib_data.generated import generate_samples
from compress.calib_data.samples import calibration_samples, token_stream
from compress.calib_data.sources import SELF, read_texts


def load_calibration(cfg, model, tokenizer, cache_key: str | None = None) -> torch.Tensor:
    """Samples from `cfg.source`; `self` asks the (original) model to write them."""
    if cfg.source == SELF:
        return generate_samples(
            model, tokenizer, cfg.samples, cfg.length, cfg.seed, cache_key=cache_key
        )
    stream = token_stream(tokenizer, read_texts(cfg.source, cfg.text_field))
    return calibration_samples(stream, cfg.samples, cfg.length, cfg.seed)
