"""What a recipe will take on this machine: printed before it starts, and kept in the
manifest beside what it took (`timing_s`).

Each stage states its work in FLOPs (`Described.work`): GPTQ's Hessians and column solve,
AWQ's grid of scaled forwards, tune's forward and backward steps, the Fisher pass, the
repair's teacher and student. The pipeline adds one pass of the calibration tokens
through the blocks for each stage that calibrates, and one for the walk. The sum over
this machine's matrix-multiply rate, its fastest call in a fifth of a second now, is the
estimate. Each kind of work carries a factor for how far it runs from the probe's rate,
fitted on the default model and the Llama-3.2-1B and Qwen2.5-7B shapes on a 2-core AMD
EPYC (docs/results.md, "Quality per minute: the presets"); reading the checkpoint
and writing the artifact are not counted.
"""

from __future__ import annotations

from compress.model.workload import Workload, duration, matmul_rate

# A pass of calibration tokens through the blocks ran at this fraction of the probe's
# rate: on the default model, 105 s for 128 × 512 tokens (1.5e13 FLOPs) in fp32 on
# 2 cores whose probe measured 160-190 GFLOP/s.
PASS_EFFICIENCY = 0.75


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
