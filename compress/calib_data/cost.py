"""What generating calibration text will cost, said in one line before any of it starts.

Calibrating on self-generated text (the default) first has the model write
samples × length tokens one step at a time, which on a CPU can take an hour for a 135M
model: a user should know that before it starts, and that a text file of their own skips
it. The estimate is the work (2 FLOPs per weight per token, plus attention) over the rate
of the product that writes it, measured now in a fraction of a second by the writer's own
probe (runtime/calib_text.generation_probe: the runtime's dense product at the batch's
rows, on as many bytes as the model holds, in the dtype it holds them). The model's other
per-step work (norms, attention, sampling over the vocabulary) makes generation run below
that rate: measured on 2 cores (Xeon), 0.67 of it for the default model's 16 × 512 (30
narrow layers; 303 tokens/s) and 0.95 for a Llama-3.2-1B shape's 16 × 128 in bf16 (73
tokens/s, where torch's fp32 product as the probe said 37), so GENERATION_EFFICIENCY errs
long. Without a probe (transformers' forward writes it) the rate is torch's fp32 product
of BATCH rows at half (TRANSFORMERS_EFFICIENCY). What the recipe itself will take is
compress/estimate.py's.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from compress.calib_data.config import CalibConfig
from compress.calib_data.generated import BATCH, RUNTIME_BATCH, cached_samples
from compress.calib_data.sources import SELF, data_name
from compress.errors import LlmpressError
from compress.model.workload import duration, matmul_rate, workload

GENERATION_EFFICIENCY = 0.7  # generation's FLOP/s over the writer's probe's
TRANSFORMERS_EFFICIENCY = 0.5  # transformers' generation's over torch's batch-16 product
LONG_GENERATION_S = 300  # past this, say how to skip generation with a text file


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def whole_model_bytes(ckpt) -> int:
    """Memory of the checkpoint as one fp32 transformers model (what text generation loads)."""
    return 4 * sum(_numel(shape) for _, shape, _ in ckpt.tensors.values())


def available_bytes() -> int | None:
    """MemAvailable of this machine (Linux), or None where it cannot be read."""
    try:
        text = Path("/proc/meminfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def refuse_if_too_big(need: int, what: str, fix: str, fp32: bool = True) -> None:
    """One line, before hours of work end in the kernel's out-of-memory kill. `fp32`:
    whether `need` is the model in fp32 (else as stored)."""
    free = available_bytes()
    if free is not None and need > free:
        form = "in fp32" if fp32 else "as stored"
        raise LlmpressError(
            f"{what} loads the whole model ({need / 1e9:.1f} GB {form}) and this machine has "
            f"{free / 1e9:.1f} GB available: use {fix} (block by block, any size)"
        )


def calibration_plan(
    cfg: CalibConfig, ckpt, probe: Callable[[int], float] | None = None, held: int | None = None
) -> str:
    """The line `compress` prints before calibrating: the source, samples × length, and
    the estimated time to generate the text (`self`, unless cached); what calibrating
    takes is in the line before it (compress/estimate.py). `probe(rows)`: the FLOP/s of
    the writer's product at that many rows (runtime/calib_text.generation_probe); `held`:
    the bytes the writer holds the model in (else: the whole model in fp32, as
    transformers loads it)."""
    tokens = cfg.samples * cfg.length
    parts = [f"calibration: {cfg.samples} × {cfg.length} tokens"]
    long_generation = False
    if cfg.source == SELF:
        if cached_samples(ckpt.sha256, cfg.samples, cfg.length, cfg.seed) is not None:
            parts[0] += " of self-generated text (cached)"
        else:
            if probe is None:
                rate = matmul_rate(BATCH, 4096) * TRANSFORMERS_EFFICIENCY
            else:
                rate = probe(min(RUNTIME_BATCH, cfg.samples)) * GENERATION_EFFICIENCY
            seconds = workload(ckpt, cfg.samples, cfg.length).forward(tokens, head=True) / rate
            speed = tokens / seconds
            parts[0] += " of text the model generates itself"
            need = whole_model_bytes(ckpt) if held is None else held
            fp32 = held is None or held >= whole_model_bytes(ckpt)
            refuse_if_too_big(need, "--calib self", "--calib FILE.txt", fp32)
            form = "in fp32" if fp32 else "as stored"
            parts.append(
                f"generating it: ~{duration(seconds)} (~{speed:.0f} tokens/s here) with the "
                f"whole model in memory (~{need / 1e9:.1f} GB {form})"
            )
            long_generation = seconds > LONG_GENERATION_S
    else:
        parts[0] += f" from {data_name(cfg.source)}"
    line = "; ".join(parts)
    if long_generation:
        line += "; to skip generating, calibrate on your own text: --calib FILE.txt"
    return line
