"""The repair's compute precision: `fp32`, `bf16`, or `auto`.

bf16 runs the forward and backward matmuls under torch.autocast while the trained values
(weights, log-scales, zero-point offsets) and Adam's moments stay fp32, so only the
products are rounded. It pays where the hardware multiplies bf16 natively: `auto` takes it
on a CPU with AMX-BF16, where it was measured (benchmarks/repair_sweep.py), and on a CUDA
device with bf16, and keeps fp32 elsewhere. A CPU with AVX512-BF16 but no AMX may be asked
for bf16 explicitly (unmeasured here); one with neither would emulate it, slower than
fp32, so `bf16` is refused there rather than run slowly.
"""

from __future__ import annotations

import contextlib

import torch

from compress.errors import LlmpressError

PRECISIONS = ("auto", "fp32", "bf16")


def bf16_support(device: torch.device) -> tuple[bool, bool]:
    """(whether `device` multiplies bf16 in hardware, whether `auto` should use it)."""
    if device.type == "cuda":
        ok = torch.cuda.is_bf16_supported()
        return ok, ok
    if device.type != "cpu":
        return False, False
    amx = bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)())
    avx512 = bool(getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)())
    return amx or avx512, amx


def choose(precision: str, device: torch.device) -> str:
    """What `precision` (one of PRECISIONS) runs as on `device`: `auto` → `bf16` where the
    device runs it fast, else `fp32`. Never refuses (the time estimate asks this too)."""
    if precision == "auto":
        return "bf16" if bf16_support(device)[1] else "fp32"
    return precision


def resolve(precision: str, device: torch.device) -> str:
    """`choose`, and an explicit `bf16` the device cannot multiply natively refused in one
    line."""
    if precision == "bf16" and not bf16_support(device)[0]:
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
