"""Rotary position tables for every rope kind the supported families ship.

One function turns a layer's rope description into cos/sin tables; the runtime (torch, C
and Triton) reads only the tables, so a new kind is one branch here (a layer without rope
is one too: identity tables). The formulas are the
published ones (Llama 3's wavelength bands, YaRN's ramp and attention factor, Phi-3's
LongRoPE factors); docs/families.md §2 lists them with their sources.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from compress.errors import LlmpressError

# "none": a layer that rotates nothing (SmolLM3's NoPE layers, config.no_rope_layers 0):
# cos 1 and sin 0, so the rotation is the identity, exactly, in every path
KINDS = ("default", "linear", "dynamic", "llama3", "yarn", "longrope", "none")


@dataclass(frozen=True)
class RopeSpec:
    """One layer type's rotary embedding: base, kind, rotated width and the kind's
    parameters (config.json's rope_parameters, as sorted items so the spec hashes)."""

    theta: float
    kind: str
    rotary_dim: int  # the first rotary_dim of each head rotate (partial rotary), the rest pass
    params: tuple = ()
    max_positions: int = 2048

    def get(self, key: str, default=None):
        value = dict(self.params).get(key)
        return default if value is None else value


def rope_spec(params: dict, head_dim: int, max_positions: int) -> RopeSpec:
    """A RopeSpec from one standardized rope_parameters dict."""
    kind = params.get("rope_type") or params.get("type") or "default"
    if kind not in KINDS:
        raise LlmpressError(
            f"rope type {kind!r} is not one llmpress implements ({', '.join(KINDS)}); "
            "open an issue with the model's config.json"
        )
    rotary = int(head_dim * float(params.get("partial_rotary_factor") or 1.0))
    items = tuple(
        sorted(
            (k, tuple(v) if isinstance(v, list) else v)
            for k, v in params.items()
            if k not in ("rope_type", "type", "rope_theta", "partial_rotary_factor")
        )
    )
    theta = float(params.get("rope_theta") or 10000.0)
    return RopeSpec(theta, kind, rotary, items, max_positions)


def inverse_frequencies(spec: RopeSpec, context: int) -> tuple[torch.Tensor, float]:
    """(inverse frequency per rotated pair [rotary_dim/2] in float64, attention factor that
    multiplies cos and sin). `context`: the longest sequence the tables serve (LongRoPE
    picks its long factors past the original context)."""
    d = spec.rotary_dim
    base = 1.0 / spec.theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    orig = spec.get("original_max_position_embeddings", spec.max_positions)
    if spec.kind == "dynamic" and spec.get("alpha"):  # Hunyuan's NTK-alpha: a fixed base
        theta = spec.theta * spec.get("alpha") ** (d / (d - 2))
        return 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d), 1.0
    if spec.kind in ("default", "dynamic"):  # dynamic equals default within the context
        return base, 1.0
    if spec.kind == "none":
        return torch.zeros_like(base), 1.0
    if spec.kind == "linear":
        return base / spec.get("factor", 1.0), 1.0
    if spec.kind == "llama3":
        factor = spec.get("factor")
        low, high = spec.get("low_freq_factor"), spec.get("high_freq_factor")
        wavelength = 2 * math.pi / base
        smooth = (orig / wavelength - low) / (high - low)
        mid = (1 - smooth) * base / factor + smooth * base
        out = torch.where(wavelength > orig / low, base / factor, base)
        between = (wavelength >= orig / high) & (wavelength <= orig / low)
        return torch.where(between, mid, out), 1.0
    if spec.kind == "yarn":
        return _yarn(spec, base, orig)
    return _longrope(spec, context, orig)


def latent_attn_scale(spec: RopeSpec, qk_width: int) -> float:
    """Multi-head latent attention's softmax scale (transformers' yarn_apply_mscale): the
    q·k width's, times YaRN's mscale(factor, mscale_all_dim) squared where the rope is
    scaled and the config gives mscale_all_dim."""
    scale = qk_width**-0.5
    m_all = spec.get("mscale_all_dim") if spec.kind != "default" else None
    factor = spec.get("factor") or 1.0
    if m_all and factor > 1:
        m = 0.1 * m_all * math.log(factor) + 1.0
        scale *= m * m
    return scale


def _yarn(spec: RopeSpec, base: torch.Tensor, orig: int) -> tuple[torch.Tensor, float]:
    d = spec.rotary_dim
    factor = spec.get("factor") or spec.max_positions / orig

    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    factor_attn = spec.get("attention_factor")
    if factor_attn is None:
        m, m_all = spec.get("mscale"), spec.get("mscale_all_dim")
        factor_attn = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    fast, slow = spec.get("beta_fast") or 32, spec.get("beta_slow") or 1

    def correction(rotations):
        return d * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(spec.theta))

    low, high = correction(fast), correction(slow)
    if spec.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(d // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: the original frequency (extrapolate), 0: interpolated by factor
    return base / factor * (1 - keep) + base * keep, float(factor_attn)


def _longrope(spec: RopeSpec, context: int, orig: int) -> tuple[torch.Tensor, float]:
    """Phi-3's LongRoPE: the short factors within the original context, the long ones past
    it, cos and sin times the attention factor. PhiMoE's (short_mscale in the config)
    divides by the short factors at any length (transformers' PhimoeRotaryEmbedding
    computes them without the sequence's length) and scales cos and sin by short_mscale
    within the original context, long_mscale past it."""
    d = spec.rotary_dim
    mscales = spec.get("short_mscale"), spec.get("long_mscale")
    long = context > orig and mscales[0] is None
    ext = spec.get("long_factor") if long else spec.get("short_factor")
    if ext is None or len(ext) != d // 2:
        raise LlmpressError(
            f"longrope needs short_factor and long_factor of {d // 2} values each in "
            "rope_parameters; fix config.json"
        )
    exponent = torch.arange(0, d, 2, dtype=torch.float64) / d
    inv = 1.0 / (torch.tensor(ext, dtype=torch.float64) * spec.theta**exponent)
    factor_attn = spec.get("attention_factor")
    if mscales[0] is not None:
        factor_attn = mscales[1] if context > orig and mscales[1] is not None else mscales[0]
    if factor_attn is None:
        scale = spec.get("factor") or spec.max_positions / orig
        factor_attn = 1.0 if scale <= 1 else math.sqrt(1 + math.log(scale) / math.log(orig))
    return inv, float(factor_attn)


def query_scales(spec: RopeSpec, length: int, device="cpu") -> torch.Tensor | None:
    """Llama 4's attention temperature, as Ministral 3 keeps it (rope_parameters'
    `llama_4_scaling_beta`): the query at position p times 1 + beta * log(1 + floor(p /
    original context)), [length] fp32, applied after rope. None where every position's is
    1 (no beta, or a context within the original one): nothing to compute."""
    beta = spec.get("llama_4_scaling_beta")
    orig = spec.get("original_max_position_embeddings", spec.max_positions)
    if not beta or length <= orig:
        return None
    steps = torch.floor(torch.arange(length, dtype=torch.float64) / orig)
    return (1 + beta * torch.log1p(steps)).float().to(device)


def tables(spec: RopeSpec, length: int, device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [length, rotary_dim/2] in fp32 (angles formed in float64), the attention
    factor applied."""
    inv, factor = inverse_frequencies(spec, length)
    angles = torch.outer(torch.arange(length, dtype=torch.float64), inv)
    cos, sin = angles.cos() * factor, angles.sin() * factor
    return cos.float().to(device), sin.float().to(device)
