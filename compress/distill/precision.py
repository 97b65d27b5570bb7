"""The repair's compute precision: `fp32`, `bf16`, or `auto`.

bf16 runs the forward and backward matmuls under torch.autocast while the trained values
(weights, log-scales, zero-point offsets) and Adam's moments stay fp32, so only the
products are rounded. It pays where the hardware multiplies bf16 natively, and `auto`
takes it there: a CPU with AMX-BF16 or AVX512-BF16 and a CUDA device with bf16. Measured
with benchmarks/repair_sweep.py on the default model's quantized repair, a step took
5.5 s in bf16 against 9.5 s in fp32 on AMX (Intel Xeon), and 6.1 s against 11.9 s on an
AMD EPYC with AVX512-BF16 and no AMX, at the same KL. A CPU with neither would emulate
bf16, slower than fp32, so `bf16` is refused there rather than run slowly.
"""

from __future__ import annotations

import contextlib

import torch

from compress.errors import LlmpressError

PRECISIONS = ("auto", "fp32", "bf16")


def cpu_bf16() -> str | None:
    """How this CPU multiplies bf16 in hardware: "amx" (AMX tiles), "avx512" (AVX512-BF16
    alone), or None."""
    if getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)():
        return "amx"
    if getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)():
        return "avx512"
    return None


def bf16_support(device: torch.device) -> bool:
    """Whether `device` multiplies bf16 in hardware (and so `auto` uses it)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu" and cpu_bf16() is not None


# A repair step of the default model, fp32 time over bf16 time, by how the CPU multiplies
# bf16 (benchmarks/repair_sweep.py; see the module docstring): the time estimate's factor.
BF16_SPEEDUP = {"amx": 9.5 / 5.5, "avx512": 11.9 / 6.1}


def bf16_speedup() -> float:
    """How much faster a repair step runs in bf16 than in fp32 on this CPU, as measured:
    AMX tiles 1.73x, AVX512-BF16 without them 1.95x (its fp32 is the slower of the two).
    A CPU with neither (an explicit bf16 estimated for a run elsewhere) takes AMX's."""
    return BF16_SPEEDUP.get(cpu_bf16(), BF16_SPEEDUP["amx"])


def choose(precision: str, device: torch.device) -> str:
    """What `precision` (one of PRECISIONS) runs as on `device`: `auto` → `bf16` where the
    device runs it fast, else `fp32`. Never refuses (the time estimate asks this too)."""
    if precision == "auto":
        return "bf16" if bf16_support(device) else "fp32"
    return precision


def resolve(precision: str, device: torch.device) -> str:
    """`choose`, and an explicit `bf16` the device cannot multiply natively refused in one
    line."""
    if precision == "bf16" and not bf16_support(device):
        raise LlmpressError(
            f"distill.precision bf16: {device} has no bf16 matrix instructions (AMX or "
            "AVX512-BF16 on a CPU, compute capability 8.0+ on CUDA), so it would run slower "
            "than fp32; use precision: fp32 or auto"
        )
    return choose(precision, device)


def autocast(precision: str, device: torch.device):
    """The context the repair's forwards run in (the backward follows their dtypes)."""
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
