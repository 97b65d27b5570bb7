"""Integer weight quantization schemes: bits, groups, zero points, and the group-size rule.

Integers are signed, q in [-2^(b-1), 2^(b-1) - 1], and dequantize as
(q - zero_point) * scale, the convention compressed-tensors stores, so the artifact
needs no conversion. Scales and zero points are computed in fp32 whatever the weight
dtype (bf16/fp16 ranges never overflow), then rounded to the storage dtype *before*
the integers are computed, so the stored scale is exactly the one the integers fit.

Group-size rule: a layer whose input dimension is not a multiple of the requested
group size g uses the largest divisor of that dimension that is at most g and a
multiple of 32 (else of 8). SmolLM2's 576-wide layers with g=128 get g=96. Every group
thus stays whole, which is what compressed-tensors, transformers and vLLM require, and
a multiple of 32 keeps each group on whole int32 words of the packed layout for every
bit width. A layer with no such divisor (an odd width) cannot take a grouped scheme:
stages refuse it before any work, naming it (see quantizers/preflight.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from compress.allocator import THRESHOLD
from compress.errors import LlmpressError

AUTO = "auto"  # a config field left to the defaults below
DEFAULT_GROUP_SIZE = 64
# Symmetric by default: transformers (5.x with compressed-tensors 0.20) and vLLM read no
# common layout of packed zero points, and the default artifact must load in both with
# nothing but their documented call (docs/format.md, "Zero points").
DEFAULT_ZERO_POINT = False


def default_group_size(bits: int) -> int | None:
    """Groups of 64 below 8 bits; one scale per output channel at 8 bits (what the
    `--quant` shorthand and a recipe both mean when they name no group)."""
    return None if bits >= 8 else DEFAULT_GROUP_SIZE


def resolve_auto(config, **defaults) -> None:
    """Replace AUTO fields of a frozen config dataclass with `defaults`."""
    for name, value in defaults.items():
        if getattr(config, name) == AUTO:
            object.__setattr__(config, name, value)


@dataclass(frozen=True)
class QuantScheme:
    """How one weight is quantized. group_size None means one scale per output channel."""

    bits: int = 4
    group_size: int | None = 64
    zero_point: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.bits, int) or not 2 <= self.bits <= 8:
            raise LlmpressError(f"bits must be an integer from 2 to 8, got {self.bits!r}")
        if self.group_size is not None and (
            not isinstance(self.group_size, int) or self.group_size < 1
        ):
            raise LlmpressError(
                f"group_size must be a positive integer or null (per-channel), "
                f"got {self.group_size!r}"
            )

    @property
    def qmin(self) -> int:
        return -(1 << (self.bits - 1))

    @property
    def qmax(self) -> int:
        return (1 << (self.bits - 1)) - 1

    def group_for(self, in_features: int) -> int | None:
        """The group size used for a layer with `in_features` inputs; None if none fits."""
        return effective_group_size(in_features, self.group_size)

    def label(self) -> str:
        """The `--quant` spelling of this scheme, e.g. w4g64zp or w8sym (per-channel)."""
        g = f"g{self.group_size}" if self.group_size else ""
        return f"w{self.bits}{g}{'zp' if self.zero_point else 'sym'}"


def effective_group_size(in_features: int, requested: int | None) -> int | None:
    if requested is None or requested >= in_features:
        return in_features
    if in_features % requested == 0:
        return requested
    for multiple in (32, 8):
        for g in range(requested - requested % multiple, 0, -multiple):
            if in_features % g == 0:
                return g
    return None


@dataclass
class QuantizedWeight:
    """A weight as integers plus the parameters that map them back to real values.

    q: int8 [out, in]; scale (and zero_point, int8, when asymmetric): [out, in // group].
    Optionally some input columns are also kept in 16-bit (LLM.int8()-style outliers):
    `outlier_weight` [out, k] holds columns `outlier_index` [k] exactly and replaces their
    integers, which stay a plain int8 view for readers that know nothing of outliers.
    `activations` names run-time input quantization ("int8-token": dynamic, per token).
    """

    q: torch.Tensor
    scale: torch.Tensor
    zero_point: torch.Tensor | None
    scheme: QuantScheme
    group_size: int
    outlier_index: torch.Tensor | None = None
    outlier_weight: torch.Tensor | None = None
    activations: str | None = None

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        w = dequantize(self.q, self.scale, self.zero_point, self.group_size)
        if self.outlier_index is not None:
            w[:, self.outlier_index.long()] = self.outlier_weight.float()
        return w.to(dtype)

    @property
    def shape(self) -> torch.Size:
        return self.q.shape

    def to(self, device: torch.device | str) -> QuantizedWeight:
        """The same weight with every tensor on `device` (the writer reads host memory)."""
        moved = {
            k: getattr(self, k).to(device)
            for k in ("q", "scale", "zero_point", "outlier_index", "outlier_weight")
            if getattr(self, k) is not None
        }
        return replace(self, **moved)


def _grouped(x: torch.Tensor, group_size: int) -> torch.Tensor:
    rows, cols = x.shape
    return x.reshape(rows, cols // group_size, group_size)


def compute_qparams(
    w: torch.Tensor,
    scheme: QuantScheme,
    group_size: int,
    storage_dtype: torch.dtype,
    clip: torch.Tensor | float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Min-max scale (and zero point) per group; `clip` shrinks the range (AWQ's search)."""
    return qparams_from_range(group_range(w, scheme, group_size), scheme, storage_dtype, clip)


def group_range(w: torch.Tensor, scheme: QuantScheme, group_size: int):
    """What a group's min-max parameters are made of: (min ≤ 0, max ≥ 0) with a zero
    point, (max |w|, None) without; a search over clip factors computes it once."""
    return grouped_range(_grouped(w.float(), group_size), scheme)


def grouped_range(g: torch.Tensor, scheme: QuantScheme):
    """group_range of weights already grouped along the last dimension, in any layout."""
    if scheme.zero_point:
        return g.amin(dim=-1).clamp(max=0), g.amax(dim=-1).clamp(min=0)
    return g.abs().amax(dim=-1), None


def qparams_from_range(
    extent, scheme: QuantScheme, storage_dtype: torch.dtype, clip: torch.Tensor | float = 1.0
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """compute_qparams from group_range's result."""
    if scheme.zero_point:
        lo, hi = extent[0] * clip, extent[1] * clip
        scale = _exact_div(hi - lo, scheme.qmax - scheme.qmin)
    else:  # max|w| / 7.5 at 4 bits (compressed-tensors' rule): -8 is used, +max rounds to 7
        scale = _exact_div(extent[0] * clip, (scheme.qmax - scheme.qmin) / 2)
    scale = storage_rounded(scale, storage_dtype)
    if not scheme.zero_point:
        return scale, None
    zp = torch.round(scheme.qmin - lo / scale.float()).clamp(scheme.qmin, scheme.qmax)
    return scale, zp.to(torch.int8)


def storage_rounded(scale: torch.Tensor, storage_dtype: torch.dtype) -> torch.Tensor:
    """Positive scales as the storage dtype holds them (never 0: its smallest normal)."""
    tiny = torch.finfo(storage_dtype).tiny
    return scale.clamp(min=tiny).to(storage_dtype).float().clamp(min=tiny).to(storage_dtype)


def _exact_div(x: torch.Tensor, divisor: float) -> torch.Tensor:
    """x / divisor, correctly rounded on every device. CUDA divides by a host scalar as a
    product with its reciprocal, one ulp off at times; at max|w| / 7.5 that ulp decides
    whether the group's negative extreme rounds to -8 or -7, so a GPU and a CPU run made
    different integers from the same weights."""
    return x / torch.full((), divisor, dtype=x.dtype, device=x.device)


def quantize_with(
    w: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor | None,
    scheme: QuantScheme,
    group_size: int,
) -> torch.Tensor:
    """Integers for `w` under given parameters: round(w / scale) + zp, clamped."""
    g = _grouped(w.float(), group_size)
    q = torch.round(g / scale.float().unsqueeze(-1))
    if zero_point is not None:
        q = q + zero_point.float().unsqueeze(-1)
    return q.clamp(scheme.qmin, scheme.qmax).to(torch.int8).reshape(w.shape)


def dequantize(
    q: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None, group_size: int
) -> torch.Tensor:
    """(q - zero point) * scale in fp32; on a CPU in slices of CPU_SLICE elements, each
    pass over a slice in cache (a Qwen2.5-7B-shaped block's seven weights: 0.29 s against
    0.66-1.4 s whole; the same values)."""
    rows, cols = q.shape
    out = torch.empty(rows, cols, dtype=torch.float32, device=q.device)
    step = cpu_slice_rows(cols) if q.device.type == "cpu" else max(rows, 1)
    for lo in range(0, rows, step):
        g = _grouped(q[lo : lo + step].to(torch.float32, copy=True), group_size)
        if zero_point is not None:
            g.sub_(zero_point[lo : lo + step].float().unsqueeze(-1))
        out[lo : lo + step] = g.mul_(scale[lo : lo + step].float().unsqueeze(-1)).reshape(-1, cols)
    return out


def quantize_weight(
    w: torch.Tensor,
    scheme: QuantScheme,
    storage_dtype: torch.dtype = torch.float32,
    device: torch.device | None = None,
) -> QuantizedWeight:
    """Round-to-nearest quantization of one [out, in] weight, of any float dtype. Rows are
    independent, so a weight is done a slice of rows at a time, each widened to fp32 when
    its turn comes: a 152k-row output projection whole in fp32 with RTN's temporaries took
    10 GB. On a CPU a slice is small enough that RTN's passes over it stay in cache
    (CPU_SLICE); on a device slices are large (ROWS). With `device`, each slice is computed
    there and its results come back to w's device."""
    if w.ndim != 2:
        raise LlmpressError(f"can only quantize 2-D weights, got shape {tuple(w.shape)}")
    group = scheme.group_for(w.shape[1])
    if group is None:
        raise LlmpressError(
            f"no group size <= {scheme.group_size} divides width {w.shape[1]} (see scheme.py)"
        )
    home, n = w.device, w.shape[0]
    on_cpu = torch.device(device or home).type == "cpu"
    rows = cpu_slice_rows(w.shape[1]) if on_cpu else ROWS
    # q, scale and zero point filled a slice at a time (concatenated at the end, a 152k
    # head's codes were held twice)
    out: list[torch.Tensor | None] = []
    for lo in range(0, n, rows):
        part = w[lo : lo + rows].to(device or home).float()
        scale, zp = compute_qparams(part, scheme, group, storage_dtype)
        q = quantize_with(part, scale, zp, scheme, group)
        got = [None if t is None else t.to(home) for t in (q, scale, zp)]
        if n <= rows:
            out = got
            break
        if not out:
            out = [None if t is None else t.new_empty(n, t.shape[1]) for t in got]
        for whole, t in zip(out, got, strict=True):
            if t is not None:
                whole[lo : lo + t.shape[0]] = t
    q, scale, zp = out
    return QuantizedWeight(q=q, scale=scale, zero_point=zp, scheme=scheme, group_size=group)


ROWS = 8192
# elements a CPU slice holds (2 MB of fp32): the seven weights of a Qwen2.5-7B-shaped
# block took 0.36 s against 1.1-2.2 s in slices of 8,192 rows on 2 Xeon cores (the same
# integers), and the default model's 4.2 against 4.4 ms. A slice's fp32 temporaries stay
# under the allocator's mmap threshold, so the heap reuses them: at the threshold itself
# (4 MB) each was mapped and page-faulted afresh, and an rtn compress of a
# Llama-3.2-1B-shaped checkpoint took 8.7M page faults and 24-26 s against 3.6M and 14 s
# (benchmarks/allocator_churn.py, an AVX-512 EPYC)
CPU_SLICE = THRESHOLD // 8


def cpu_slice_rows(cols: int) -> int:
    """Rows of a [rows, cols] slice of CPU_SLICE elements at most (one row at least)."""
    return max(1, CPU_SLICE // cols)
