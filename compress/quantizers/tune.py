"""Block-wise tuning of the quantization an earlier stage made (OmniQuant, AutoRound).

Rounding each weight to its nearest level, however well the scales were searched, is
chosen weight by weight; what matters is the block's output. This stage takes each
quantized linear of a block as its earlier stage left it (integers q, per-group scales s
and zero points z, and the unrounded weights w they came from) and trains, on the
compressed model's hidden states entering the block, toward the original model's hidden
states after it (`target: original`: the pipeline walks the original's stream beside the
compressed one, so each block also makes up for what the blocks before it got wrong; on
the default model this took the mixed@4.6 chain's KL before the repair from 0.111 to 0.100
against `target: block`, the block as read on the same compressed inputs):

- a per-group scale factor (log-parametrized, so s stays positive),
- a per-group zero-point offset (asymmetric schemes; rounded, straight through),
- optionally a per-weight rounding offset v, kept within half a level of where the
  earlier stage rounded (AutoRound's signed rounding), so each integer moves by at most
  one level.

The weight the block computes with is s·(clamp(⌊w/s + v⌉ + z) − z), the rounding passed
straight through; at the start v is set so that this equals the earlier stage's result
exactly (RTN, AWQ's clipped rounding or GPTQ's compensated one alike), so tuning starts
where that stage ended. The result is the same uniform int groups: the artifact's layout
does not change. A block whose tuned output error (on the first 16 calibration samples)
is not below its starting error keeps the starting quantization.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch.func import functional_call

from compress.distributed import all_sum, mean_squared_error, world
from compress.errors import LlmpressError
from compress.model.blocks import run_block
from compress.quantizers.scheme import QuantizedWeight
from compress.stage import BlockContext, Described, Workspace, register_stage

# tune's steps ran at 1/1.58 of a pass's rate on the default model (estimate.py)
TUNE_FACTOR = 1.58


@dataclass(frozen=True)
class TuneConfig:
    # optimizer steps per block, of `batch` calibration samples each: at the same compute,
    # 200 steps of one sample left blocks 3 and 11 of the default model 0.38 and 0.04 of
    # their output error (held out) where 100 steps of two left 0.41 and 0.12
    steps: int = 200
    batch: int = 1
    # Adam, for the rounding offsets (in levels) and log-scales, decayed linearly to 0 over
    # the steps: on the default model's blocks 3 and 11 (RTN w4g64, 16 held-out samples)
    # 2e-2 decayed left 0.41 and 0.12 of the output error, a constant 5e-3 0.45 and 0.29
    lr: float = 2e-2
    schedule: str = "linear"  # or "constant"
    rounding: bool = True  # also learn each weight's rounding direction
    samples: int | None = None  # calibration samples to tune on (None: all)
    # train on the first `positions` tokens of each sample (None: all): causal attention
    # makes a prefix's output exactly the full sample's, at a fraction of the compute
    positions: int | None = None
    # what each block's output is trained toward: "original", the original model's output
    # of this block (on the original's own hidden states), so a block also makes up for the
    # error the blocks before it left in the residual stream; or "block", this block as read
    # on the compressed model's inputs (its own error only)
    target: str = "original"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch < 1:
            raise LlmpressError("tune: steps and batch must be >= 1")
        if not 0 < self.lr < 1:
            raise LlmpressError(f"tune: lr must be in (0, 1), got {self.lr}")
        if self.samples is not None and self.samples < 1:
            raise LlmpressError("tune: samples must be >= 1 (or null for all)")
        if self.positions is not None and self.positions < 1:
            raise LlmpressError("tune: positions must be >= 1 (or null for all)")
        if self.schedule not in ("linear", "constant"):
            raise LlmpressError(f"tune.schedule: {self.schedule!r} is not one of linear, constant")
        if self.target not in ("original", "block"):
            raise LlmpressError(f"tune.target: {self.target!r} is not one of original, block")


# Samples whose output error decides whether a block keeps its tuning: a forward over 16
# instead of all 128 saves 7/8 of a pass over the block, and the gains it judges are large.
CHECK_SAMPLES = 16


def _round(x: torch.Tensor) -> torch.Tensor:
    """Round, with the gradient of the identity."""
    return x + (torch.round(x) - x).detach()


class _Tunable:
    """One linear's quantization as trainable tensors; `weight()` is differentiable."""

    def __init__(self, qw: QuantizedWeight, w: torch.Tensor, rounding: bool):
        self.qw, self.group = qw, qw.group_size
        rows, cols = qw.shape
        self.w = w.float().reshape(rows, cols // self.group, self.group)
        self.s0 = qw.scale.float()
        self.z0 = None if qw.zero_point is None else qw.zero_point.float()
        level = qw.q.float().reshape(self.w.shape)
        if self.z0 is not None:
            level = level - self.z0[..., None]
        self.v0 = level - self.w / self.s0[..., None]  # reproduces the earlier rounding
        self.log_s = torch.zeros_like(self.s0, requires_grad=True)
        self.v = self.v0.clone().requires_grad_(rounding)
        self.dz = None if self.z0 is None else torch.zeros_like(self.z0, requires_grad=True)

    def params(self) -> list[torch.Tensor]:
        found = [self.log_s, self.v, self.dz]
        return [p for p in found if p is not None and p.requires_grad]

    def _parts(self, dtype: torch.dtype):
        exact = self.s0 * self.log_s.exp()
        s = exact + (exact.to(dtype).float() - exact).detach()  # as it will be stored
        z = None if self.z0 is None else _round(self.z0 + self.dz)
        return s, z

    def weight(self, dtype: torch.dtype) -> torch.Tensor:
        scheme = self.qw.scheme
        s, z = self._parts(dtype)
        level = _round(self.w / s[..., None] + self.v)
        if z is not None:
            level = torch.clamp(level + z[..., None], scheme.qmin, scheme.qmax) - z[..., None]
        else:
            level = torch.clamp(level, scheme.qmin, scheme.qmax)
        return (level * s[..., None]).reshape(self.qw.shape)

    @torch.no_grad()
    def clamp_(self) -> None:
        self.v.copy_(torch.minimum(torch.maximum(self.v, self.v0 - 0.5), self.v0 + 0.5))
        if self.dz is not None:
            lo, hi = self.qw.scheme.qmin - self.z0, self.qw.scheme.qmax - self.z0
            self.dz.copy_(torch.minimum(torch.maximum(self.dz, lo), hi))

    @torch.no_grad()
    def result(self, dtype: torch.dtype) -> QuantizedWeight:
        scheme = self.qw.scheme
        s = (self.s0 * self.log_s.exp()).to(dtype)
        z = None if self.z0 is None else torch.round(self.z0 + self.dz)
        level = torch.round(self.w / s.float()[..., None] + self.v)
        if z is not None:
            q = torch.clamp(level + z[..., None], scheme.qmin, scheme.qmax)
        else:
            q = torch.clamp(level, scheme.qmin, scheme.qmax)
        return QuantizedWeight(
            q=q.to(torch.int8).reshape(self.qw.shape),
            scale=s,
            zero_point=None if z is None else z.to(torch.int8),
            scheme=scheme,
            group_size=self.group,
        )


@register_stage("tune", TuneConfig)
class Tune(Described):
    activations = None
    needs_calibration = True
    refines = True
    scheme = None  # keeps the scheme of the stage before it

    def work(self, load) -> float:
        """Each block's steps: a forward and a backward (3 forwards) of batch × positions
        tokens."""
        c = self.config
        positions = min(c.positions or load.length, load.length)
        return TUNE_FACTOR * 3 * load.forward(c.steps * c.batch * positions)

    def __init__(self, config: TuneConfig):
        self.config = config
        self.needs_reference = config.target == "block"
        self.needs_original = config.target == "original"
        self.loss: dict[str, tuple[float, float]] = {}  # block -> (before, after)
        self.kept: list[str] = []  # blocks whose tuning did not help
        self.skipped: list[str] = []  # linears it does not tune (16-bit columns, W8A8)
        self.seconds = {"tuning": 0.0}

    def preflight(self, ws: Workspace) -> None:
        """Nothing beyond the quantizing stage before it."""

    def calibrate(self, ctx: BlockContext) -> None:
        """Trains in `transform`, on the inputs and reference output the pipeline carries."""

    def transform(self, ctx: BlockContext) -> None:
        started = time.perf_counter()
        tunables = {}
        for rel in ctx.targets():
            qw = ctx.ws.quantized.get(f"{ctx.prefix}.{rel}")
            if qw is None:
                continue
            if qw.outlier_index is not None or qw.activations or rel not in ctx.unrounded:
                self.skipped.append(f"{ctx.prefix}.{rel}")
                continue
            tunables[rel] = _Tunable(qw, ctx.unrounded[rel], self.config.rounding)
        if tunables:
            self._tune(ctx, tunables)
        self.seconds["tuning"] += time.perf_counter() - started

    def _tune(self, ctx: BlockContext, tunables: dict[str, _Tunable]) -> None:
        cfg, dtype = self.config, ctx.ws.storage_dtype
        # global sample counts; under torchrun this rank holds some of them (ctx.shard)
        n = ctx.samples if cfg.samples is None else min(cfg.samples, ctx.samples)
        target = ctx.original if cfg.target == "original" else ctx.reference
        local = ctx.rows_below(n)
        x, y = ctx.inputs[:local], target[:local]
        module, rope = ctx.module, ctx.rope
        device = next(module.parameters()).device  # x and y may live in host memory

        length = x.shape[1] if cfg.positions is None else min(cfg.positions, x.shape[1])
        prefix = rope.prefix(length).kwargs(module)

        def run(xb: torch.Tensor, weights: dict[str, torch.Tensor]) -> torch.Tensor:
            return functional_call(module, weights, (xb,), prefix)

        def weights() -> dict[str, torch.Tensor]:
            return {f"{rel}.weight": t.weight(dtype) for rel, t in tunables.items()}

        k = ctx.rows_below(min(n, CHECK_SAMPLES))

        def error(out: torch.Tensor) -> float:
            return mean_squared_error(out[:k].split(rope.chunk), y[:k].split(rope.chunk))

        before = error(run_block(module, x[:k], rope))
        params = [p for t in tunables.values() for p in t.params()]
        optimizer = torch.optim.Adam(params, cfg.lr)
        schedule = None
        if cfg.schedule == "linear":
            schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: 1 - i / cfg.steps)
        gen = torch.Generator().manual_seed(cfg.seed + ctx.index)
        order = torch.randperm(n, generator=gen, device="cpu")  # the same on every device
        module.requires_grad_(False)
        for step in range(cfg.steps):
            lo = (step * cfg.batch) % n
            if lo + cfg.batch > n:
                order = torch.randperm(n, generator=gen, device="cpu")
            idx = order[(step * cfg.batch + torch.arange(cfg.batch, device="cpu")) % n]
            rows = idx if ctx.shard is None else ctx.shard.rows(idx.tolist())
            optimizer.zero_grad(set_to_none=True)
            if len(rows):
                xb, yb = x[rows, :length].to(device), y[rows, :length].to(device)
                error_b = (run(xb, weights()) - yb).pow(2)
                if len(rows) == len(idx):  # every sample of the step is here (one process)
                    loss = error_b.mean()
                else:  # this rank's share of the step's mean
                    loss = error_b.sum() / (len(idx) * error_b[0].numel())
                loss.backward()
            if world() > 1:  # every rank takes the same step
                for p in params:
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
                    all_sum(p.grad)
            optimizer.step()
            if schedule is not None:
                schedule.step()
            for t in tunables.values():
                t.clamp_()
        starting = {rel: ctx.ws.quantized[f"{ctx.prefix}.{rel}"] for rel in tunables}
        for rel, t in tunables.items():
            ctx.set_quantized(rel, t.result(dtype))
        out = run_block(module, x, rope)  # the tuned block's output: it propagates
        after = error(out)
        self.loss[ctx.prefix] = (before, after)
        if after >= before:
            self.kept.append(ctx.prefix)
            for rel, qw in starting.items():
                ctx.set_quantized(rel, qw)
        elif n == ctx.samples:  # else the output of some samples was not computed
            ctx.output = out

    def export(self, ws: Workspace) -> dict:
        return {
            "stage": "tune",
            "steps": self.config.steps,
            # before and after tuning, on the first CHECK_SAMPLES calibration samples
            "output_mse": {k: [round(a, 6), round(b, 6)] for k, (a, b) in self.loss.items()},
            "checked_samples": CHECK_SAMPLES,
            "not_improved": self.kept,
            "not_tuned": self.skipped,
            "seconds": {k: round(v, 1) for k, v in self.seconds.items()},
        }

    @staticmethod
    def summary(record: dict) -> str | None:
        pairs = list(record.get("output_mse", {}).values())
        if not pairs:
            return None
        gain = sum(b for _, b in pairs) / max(sum(a for a, _ in pairs), 1e-30)
        return f"tuned {len(pairs)} blocks: output error {gain:.2f}× the untuned"
