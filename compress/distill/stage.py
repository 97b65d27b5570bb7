"""The `distill` stage: the original model teaches a pruned or quantized one back.

Recipe form, after `prune` (trains every weight but the embeddings):

    - distill: {tokens: 300000, lr: 3.0e-4, checkpoint_every: 50}
    - distill: {tokens: 2000000, max_minutes: 30, data: train.txt, samples: 1024}

or last, after the quantizing stages (trains only the quantized linears' scales and zero
points, the integers fixed: compress/distill/quantized.py):

    - awq: {bits: 4}
    - distill: {tokens: 65536, scale_lr: 1.0e-3}

It trains on calibration text only: the recipe's calibration samples, or `data`
(a file, dataset or `self`) cut into `samples` × `length` token samples.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from compress.calib_data.config import CalibConfig
from compress.distill.loop import DistillSettings, distill, fingerprint
from compress.distill.precision import PRECISIONS, bf16_speedup, choose, resolve
from compress.distill.quantized import dense_vectors, param_groups, wrap
from compress.distill.sharding import MODES
from compress.errors import LlmpressError
from compress.stage import Described, ModelContext, register_stage

# the repair ran at 1/1.1 of a pass's rate on the default model (compress/estimate.py)
REPAIR_FACTOR = 1.1


@dataclass(frozen=True)
class DistillConfig:
    tokens: int = 200_000  # token budget: steps = tokens / (batch × length)
    max_minutes: float | None = None  # time budget: stop early when it runs out
    batch: int = 4  # sequences per step
    length: int | None = None  # tokens per sequence (default: the calibration length)
    lr: float = 2e-4
    scale_lr: float = 1e-3  # after quantization: Adam lr of the log-scales and zero points
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
    parallel: str = "auto"  # under torchrun: ddp, fsdp, or auto (fsdp where ddp does not fit)
    precision: str = "auto"  # fp32, bf16, or auto: bf16 where the device has it natively
    # after quantization: also train the blocks' and the final norm's weights and the
    # biases, which the artifact stores dense (they cost no bits)
    train_dense: bool = False
    # after quantization: Adam lr of offsets on the integer codes themselves, in levels
    # (0: the integers stay as the quantizer left them)
    code_lr: float = 0.0

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise LlmpressError(
                f"distill.precision: {self.precision!r} is not one of {', '.join(PRECISIONS)}"
            )
        if self.parallel not in MODES:
            raise LlmpressError(
                f"distill.parallel: {self.parallel!r} is not one of {', '.join(MODES)}"
            )
        if self.tokens < 1 or self.batch < 1 or self.checkpoint_every < 1:
            raise LlmpressError("distill: tokens, batch and checkpoint_every must be >= 1")
        if self.lr <= 0 or self.scale_lr <= 0 or self.temperature <= 0:
            raise LlmpressError("distill: lr, scale_lr and temperature must be > 0")
        if not 0 <= self.warmup < 1 or not 0 <= self.min_lr_ratio <= 1:
            raise LlmpressError("distill: warmup must be in [0, 1) and min_lr_ratio in [0, 1]")
        if self.code_lr < 0:
            raise LlmpressError("distill.code_lr: must be >= 0 (0 keeps the integer codes)")
        if self.max_minutes is not None and self.max_minutes <= 0:
            raise LlmpressError("distill.max_minutes: must be > 0")


# Zero points train at the log-scales' rate, rounded straight through: a level moves only
# under a gradient consistent over hundreds of steps. (At 20× all of them crossed half a
# level within 5 steps and the KL jumped 6×: Adam moves every one by its lr each step.)
ZERO_LR_FACTOR = 1


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
    data_parallel = True  # the repair trains as DDP or FSDP under torchrun
    requires = (("prune", "repairs a pruned model"),)  # stages that must come first, and why
    repairs_quantized = True  # may also come last, after the quantizing stages

    def work(self, load) -> float:
        """Every step: the teacher forward, the student forward and backward (the rate a
        CPU gets: the estimate is one of this machine's CPU)."""
        c = self.config
        length = c.length or load.length
        tokens = max(1, c.tokens // (c.batch * length)) * c.batch * length
        # choose, not resolve: a bf16 the CPU lacks may run on a GPU, and run() checks that
        bf16 = choose(c.precision, torch.device("cpu")) == "bf16"
        faster = bf16_speedup() if bf16 else 1
        return REPAIR_FACTOR * 4 * load.forward(tokens, head=True) / faster

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
        for option, given in (("train_dense", c.train_dense), ("code_lr", c.code_lr > 0)):
            if ctx.quantized is None and given:
                raise LlmpressError(
                    f"distill.{option}: applies to repairing a quantized model (after a "
                    "pruned one every weight trains already); remove it"
                )
        if c.train_dense and ctx.updated is None:
            raise LlmpressError("distill.train_dense: this run keeps no dense tensors")
        if ctx.quantized is not None and c.hidden_weight > 0:
            raise LlmpressError(
                "distill: hidden_weight applies to repairing a pruned model; set it to 0 "
                "when distill repairs the quantized one"
            )
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
        groups = wrapped = None
        if ctx.quantized is not None:  # scales and zero points train (codes: if code_lr)
            wrapped = wrap(ctx.model, ctx.quantized, codes=c.code_lr > 0)
            groups = param_groups(wrapped, c.scale_lr, ZERO_LR_FACTOR * c.scale_lr, c.code_lr)
            if c.train_dense:
                dense = dense_vectors(ctx.model, ctx.adapter)
                groups.append({"params": list(dense.values()), "lr": c.scale_lr})
        settings = DistillSettings(
            steps=max(1, c.tokens // (c.batch * data.shape[1])),
            batch=c.batch,
            lr=c.lr if wrapped is None else c.scale_lr,
            warmup=c.warmup,
            min_lr_ratio=c.min_lr_ratio,
            weight_decay=c.weight_decay,
            temperature=c.temperature,
            hidden_weight=c.hidden_weight,
            checkpoint_every=c.checkpoint_every,
            max_seconds=None if c.max_minutes is None else c.max_minutes * 60,
            train_embeddings=c.train_embeddings,
            seed=c.seed,
            parallel=c.parallel,
            train_dense=wrapped is not None and c.train_dense,
            precision=resolve(c.precision, next(ctx.model.parameters()).device),
        )
        ctx.log(
            f"distill: {settings.steps} steps × {c.batch} × {data.shape[1]} tokens from "
            f"{data.shape[0]} samples in {settings.precision}, checkpoint every "
            f"{c.checkpoint_every} steps in {ctx.work_dir}"
        )
        settings_id = fingerprint(settings, ctx.config, data, ctx.model, groups)
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
            param_groups=groups,
            log=ctx.log,
        )
        trained = "weights"
        if wrapped is not None:
            for name, module in wrapped.items():
                ctx.quantized[name] = module.result(ctx.storage_dtype)
            trained = f"scales and zero points of {len(wrapped)} quantized linears"
            if c.code_lr > 0:
                trained = f"codes, {trained}"
            if c.train_dense:
                for name, p in dense.items():
                    ctx.updated[name] = p.detach().to("cpu", ctx.storage_dtype).clone()
                trained += f", and {len(dense)} norm weights and biases"
        return {"stage": "distill", "samples": int(data.shape[0]), "trained": trained, **record}
