"""What a recipe will take on this machine: printed before it starts, and kept in the
manifest beside what it took (`timing_s`).

Each stage states its work in FLOPs (`Described.work`): GPTQ's Hessians and column solve,
AWQ's grid of scaled forwards, tune's forward and backward steps, the Fisher pass, the
repair's teacher and student. The pipeline adds one pass of the calibration tokens
through the blocks for each stage that calibrates, and one for the walk. The sum over
this machine's matrix-multiply rate, measured now in a tenth of a second, is the
estimate. Each kind of work carries a factor for how far it runs from the probe's rate,
fitted on the default model and the Llama-3.2-1B and Qwen2.5-7B shapes on a 2-core AMD
EPYC (docs/results.md, "Quality per minute: the presets"); reading the checkpoint
and writing the artifact are not counted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

# A pass of calibration tokens through the blocks ran at this fraction of the probe's
# rate: on the default model, 105 s for 128 × 512 tokens (1.5e13 FLOPs) in fp32 on
# 2 cores whose probe measured 160-190 GFLOP/s.
PASS_EFFICIENCY = 0.75


@dataclass(frozen=True)
class Workload:
    """What the work of a recipe depends on: one block's linears, the model's depth and
    output projection, and the calibration tokens."""

    layers: int
    linears: tuple[tuple[int, int], ...]  # one block's [out, in], every expert's too
    inputs: tuple[int, ...]  # one block's distinct linear input widths (GPTQ's Hessians)
    active: float  # share of a block's weights one token multiplies (top_k of experts)
    hidden: int
    vocab: int
    samples: int
    length: int

    @property
    def tokens(self) -> int:
        return self.samples * self.length

    @property
    def block_weights(self) -> int:
        """Every block linear's weights, summed over the depth."""
        return self.layers * sum(o * i for o, i in self.linears)

    def forward(self, tokens: int, head: bool = False) -> float:
        """FLOPs of `tokens` through every block (and the output projection): 2 per weight
        a token multiplies, plus attention over half the sequence on average."""
        weights = self.active * self.block_weights + (self.vocab * self.hidden if head else 0)
        return tokens * (2 * weights + 2 * self.length * self.hidden * self.layers)


def workload(ckpt, samples: int, length: int) -> Workload:
    """The workload of `ckpt` (its bound adapter) on samples × length calibration tokens."""
    adapter, config = ckpt.adapter, ckpt.config
    shape = adapter.shape(config)
    shapes = adapter.linear_shapes(shape)
    shared = {name: group[0] for group in adapter.shared_inputs for name in group}
    inputs = {shared.get(name, name): shapes[name][1] for name in shapes}
    mlp = adapter.spec(config).mlp
    total = sum(o * i for o, i in shapes.values())
    active = 1.0
    if mlp is not None:  # a token multiplies top_k of the experts' weights
        experts = sum(o * i for n, (o, i) in shapes.items() if n in adapter.expert_linears)
        active = (total - experts + experts * mlp.top_k / mlp.experts) / total
    return Workload(
        layers=shape.layers,
        linears=tuple(shapes.values()),
        inputs=tuple(inputs.values()),
        active=active,
        hidden=shape.hidden,
        vocab=shape.vocab,
        samples=samples,
        length=length,
    )


def estimate(stages, load: Workload, passes: int, rate: float | None = None) -> dict:
    """Seconds per part of the recipe: `passes` passes of the calibration tokens through
    the blocks, then each stage's own work."""
    rate = (rate or matmul_rate(512, 1024)) * PASS_EFFICIENCY
    parts = {"calibration passes": passes * load.forward(load.tokens) / rate} if passes else {}
    for stage in stages:
        flops = stage.work(load)
        if flops:
            parts[stage.name] = parts.get(stage.name, 0.0) + flops / rate
    return {k: round(v, 1) for k, v in parts.items()}


def estimate_line(parts: dict) -> str:
    """The line `compress` prints before the work starts."""
    total = sum(parts.values())
    if total < 60:
        return "estimated time here: <1 min (reading and writing not counted)"
    big = sorted(parts.items(), key=lambda kv: -kv[1])
    shown = ", ".join(f"{k} {_seconds(v)}" for k, v in big if v >= 30)
    return f"estimated time here: ~{duration(total)} ({shown}; reading and writing not counted)"


def _seconds(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else duration(seconds)


def matmul_rate(rows: int, width: int, seconds: float = 0.1) -> float:
    """FLOP/s of a float32 [rows, width] × [width, width] product on this machine now."""
    a, b = torch.randn(rows, width), torch.randn(width, width)
    a @ b  # warm-up: threads started, memory touched
    done, start = 0, time.perf_counter()
    while True:
        a @ b
        done += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return done * 2 * rows * width * width / elapsed


def duration(seconds: float) -> str:
    minutes = seconds / 60
    if minutes < 1:
        return "<1 min"
    return f"{minutes:.0f} min" if minutes < 90 else f"{minutes / 60:.1f} h"
