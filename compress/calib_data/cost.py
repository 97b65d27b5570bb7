"""What generating calibration text will cost, said in one line before any of it starts.

Calibrating on self-generated text (the default) first has the model write
samples × length tokens one step at a time, which on a CPU can take an hour for a 135M
model: a user should know that before it starts, and that a text file of their own skips
it. The estimate is the work (2 FLOPs per weight per token, plus attention) over this
machine's matrix-multiply rate, measured now in a fraction of a second: generation
multiplies 16 rows (the batch generate_samples decodes; the runtime decodes up to 32) by
every weight, so it streams the weights from memory; the probe's 64 MB matrix does too.
The model's other per-step work (30 layers of small operations, sampling over the
vocabulary) makes generation run at about half of that rate: measured on the default
model on 2 cores, the runtime wrote 16 × 512 tokens at 110-150 tokens/s against a probe
that predicted 52 at a quarter (GENERATION_EFFICIENCY). What the recipe itself will take
is compress/estimate.py's.
"""

from __future__ import annotations

from pathlib import Path

from compress.calib_data.config import CalibConfig
from compress.calib_data.generated import BATCH, cached_samples
from compress.calib_data.sources import SELF, data_name
from compress.errors import LlmpressError
from compress.model.workload import duration, matmul_rate, workload

GENERATION_EFFICIENCY = 0.5  # generation's tokens/s over the batch-16 probe's rate
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


def refuse_if_too_big(need: int, what: str, fix: str) -> None:
    """One line, before hours of work end in the kernel's out-of-memory kill."""
    free = available_bytes()
    if free is not None and need > free:
        raise LlmpressError(
            f"{what} loads the whole model ({need / 1e9:.1f} GB in fp32) and this machine has "
            f"{free / 1e9:.1f} GB available: use {fix} (block by block, any size)"
        )


def calibration_plan(cfg: CalibConfig, ckpt) -> str:
    """The line `compress` prints before calibrating: the source, samples × length, and
    the estimated time to generate the text (`self`, unless cached); what calibrating
    takes is in the line before it (compress/estimate.py)."""
    tokens = cfg.samples * cfg.length
    parts = [f"calibration: {cfg.samples} × {cfg.length} tokens"]
    long_generation = False
    if cfg.source == SELF:
        if cached_samples(ckpt.sha256, cfg.samples, cfg.length, cfg.seed) is not None:
            parts[0] += " of self-generated text (cached)"
        else:
            rate = matmul_rate(BATCH, 4096) * GENERATION_EFFICIENCY
            seconds = workload(ckpt, cfg.samples, cfg.length).forward(tokens, head=True) / rate
            speed = tokens / seconds
            parts[0] += " of text the model generates itself"
            need = whole_model_bytes(ckpt)
            refuse_if_too_big(need, "--calib self", "--calib FILE.txt")
            parts.append(
                f"generating it: ~{duration(seconds)} (~{speed:.0f} tokens/s here) with the "
                f"whole model in memory (~{need / 1e9:.1f} GB in fp32)"
            )
            long_generation = seconds > LONG_GENERATION_S
    else:
        parts[0] += f" from {data_name(cfg.source)}"
    line = "; ".join(parts)
    if long_generation:
        line += "; to skip generating, calibrate on your own text: --calib FILE.txt"
    return line
