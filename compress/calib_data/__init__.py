"""Calibration and evaluation text: sources, fixed-length token samples, self-generated text."""

from compress.calib_data.samples import calibration_samples, eval_windows, token_stream
from compress.calib_data.sources import read_texts

__all__ = ["calibration_samples", "eval_windows", "read_texts", "token_stream"]
