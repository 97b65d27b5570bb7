"""Every compression method, listed once. Importing this module registers each method's
stage (`compress.stage.register_stage`); `STAGES` then maps the recipe's stage names to
them. A new method is one module behind the stage interface plus one line here."""

from __future__ import annotations

from compress.distill import stage as distill
from compress.pruning import stage as prune
from compress.quantizers import awq, gptq, int8_outlier, mixed, rtn, tune
from compress.stage import STAGES

MODULES = (rtn, awq, gptq, tune, int8_outlier, mixed, prune, distill)

__all__ = ["MODULES", "STAGES"]
