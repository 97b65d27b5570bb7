"""The `distill` stage: repair a pruned (or otherwise changed) model against the original.

Recipe form (after `prune`):

    - distill: {tokens: 300000, lr: 3.0e-4, checkpoint_every: 50}
    - distill: {tokens: 2000000, max_minutes: 30, data: train.txt, samples: 1024}

It trains on calibration text only: the recipe's calibration samples, or `data`
(a file, dataset or `self`) cut into `samples` × `length` token samples.
"""

from __future__ import annotations

from dataclasses import dataclass

from compress.calib_data.config import CalibConfig
from compress.distill.loop import DistillSettings, distill, fingerprint
from compress.errors import LlmpressError
from compress.stage import Described, ModelContext, register_stage


@dataclass(frozen=True)
class DistillConfig:
    tokens: int = 200_000  # token budget: steps = tokens / (batch × length)
    max_minutes: float | None = None  # time budget: stop early when it runs out
    batch: int = 4  # sequences per step
    length: int | None = None  # tokens per sequence (default: the calibration length)
    lr: float = 2e-4
    warmup: float = 0.05  # fraction of the steps spent warming up
    min_lr_ratio: float = 0.1  # cosine decays to lr × this
    weight_decay: float = 0.0
    temperature: float = 1.0
    hidden_weight: float = 0.0  # weight of the matched-layer hidden-state loss (0: off)
    checkpoint_every: int = 50  # steps
    train_embeddings: bool = False  # the (tied) embedding is frozen by default
    data: str | None = None  # distillation text (default: the recipe's calibration samples)
    samples: int | None = None  # samples cut from `data` (default: calib.samples)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.tokens < 1 or self.batch < 1 or self.checkpoint_every < 1:
            raise LlmpressError("distill: tokens, batch and checkpoint_every must be >= 1")
        if self.lr <= 0 or self.temperature <= 0:
            raise LlmpressError("distill: lr and temperature must be > 0")
        if not 0 <= self.warmup < 1 or not 0 <= self.min_lr_ratio <= 1:
            raise LlmpressError("distill: warmup must be in [0, 1) and min_lr_ratio in [0, 1]")
        if self.max_minutes is not None and self.max_minutes <= 0:
            raise LlmpressError("distill.max_minutes: must be > 0")


@register_stage("distill", DistillConfig)
class Distill(Described):
    tags = ("distillation",)
    changes_architecture = True  # the weights are trained

    @staticmethod
    def summary(record: dict) -> str | None:
        history = record["loss_history"]
        return (
            f"distilled: {record['steps']} steps, {record['tokens']:,} tokens, "
            f"final KL {history[-1][1] if history else '?'}"
        )

    needs_calibration = True
    whole_model = True
    requires = (("prune", "repairs a pruned model"),)  # stages that must come first, and why

    def __init__(self, config: DistillConfig):
        self.config = config

    def preflight(self, config: dict) -> None:
        """Nothing about the model's shape can stop distillation."""

    def planned_config(self, config: dict) -> dict:
        return config

    def run(self, ctx: ModelContext) -> dict:
        c = self.config
        if ctx.model is ctx.teacher:
            raise LlmpressError("distill: the model equals the original; put it after prune")
        data = ctx.samples
        if c.data is not None:
            data = ctx.load_text(
                CalibConfig(
                    source=c.data,
                    samples=c.samples or data.shape[0],
                    length=c.length or data.shape[1],
                    seed=c.seed,
                )
            )
        if c.length is not None:
            if c.length > data.shape[1]:
                raise LlmpressError(
                    f"distill.length {c.length} is longer than the samples ({data.shape[1]} "
                    "tokens): lower it or raise calib.length"
                )
            data = data[:, : c.length]
        settings = DistillSettings(
            steps=max(1, c.tokens // (c.batch * data.shape[1])),
            batch=c.batch,
            lr=c.lr,
            warmup=c.warmup,
            min_lr_ratio=c.min_lr_ratio,
            weight_decay=c.weight_decay,
            temperature=c.temperature,
            hidden_weight=c.hidden_weight,
            checkpoint_every=c.checkpoint_every,
            max_seconds=None if c.max_minutes is None else c.max_minutes * 60,
            train_embeddings=c.train_embeddings,
            seed=c.seed,
        )
        ctx.log(
            f"distill: {settings.steps} steps × {c.batch} × {data.shape[1]} tokens from "
            f"{data.shape[0]} samples, checkpoint every {c.checkpoint_every} steps "
            f"in {ctx.work_dir}"
        )
        settings_id = fingerprint(settings, ctx.config, data, ctx.model)
        record = distill(
            ctx.model,
            ctx.teacher,
            data,
            settings,
            work_dir=ctx.work_dir,
            resume=ctx.resume,
            run_id=settings_id,
            layer_map=ctx.layer_map or list(range(ctx.config["num_hidden_layers"])),
            hidden_index=ctx.hidden_index,
            adapter=ctx.adapter,
            log=ctx.log,
        )
        return {"stage": "distill", "samples": int(data.shape[0]), **record}
