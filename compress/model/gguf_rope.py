"""Rope scaling a GGUF file holds, which transformers' GGUF reader drops.

llama.cpp's converter writes a model's rope scaling as header keys (`{arch}.rope.scaling.*`:
linear for Gemma 3 from 4B up, YaRN) or as tensors: Llama 3.1+'s `llama3` scaling as
`rope_freqs.weight` (a divisor per frequency), Phi-3's LongRoPE as
`rope_factors_long/short.weight`. transformers reads only the base frequency, so without
this the converted model would rotate every position differently from the original.
What is read here goes back into the config; what cannot be recovered is refused.
"""

from __future__ import annotations

import math

from compress.errors import LlmpressError

# Llama 3.x's published llama3 scaling (factor, low, high, original context); the
# rope_freqs tensor is matched against each, as llama.cpp computes it
LLAMA3_KNOWN = ((8.0, 1.0, 4.0, 8192), (32.0, 1.0, 4.0, 8192), (16.0, 1.0, 4.0, 8192))


def llama3_divisors(theta: float, dim: int, factor, low, high, original) -> list[float]:
    """The rope_freqs tensor llama.cpp's converter writes for a llama3 scaling."""
    out = []
    for i in range(0, dim, 2):
        wavelen = 2 * math.pi * theta ** (i / dim)
        if wavelen < original / high:
            out.append(1.0)
        elif wavelen > original / low:
            out.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return out


def _llama3(divisors: list[float], theta: float, dim: int) -> dict | None:
    """The llama3 parameters that reproduce `divisors`: a published setting, else fitted.
    Between its bounds the divisor is 1 / ((1 - s) / f + s) with s linear in 1/wavelength,
    so two such points fix the curve (low_freq_factor taken as 1, as every Llama 3 has)."""
    f = max(divisors)
    candidates = list(LLAMA3_KNOWN)
    inner = [
        (1 / (2 * math.pi * theta ** (2 * i / dim)), (1 / d - 1 / f) / (1 - 1 / f))
        for i, d in enumerate(divisors)
        if 1 + 1e-6 < d < f - 1e-6
    ]
    if len(inner) >= 2:  # s = a x - b, least squares
        n = len(inner)
        mx, ms = sum(x for x, _ in inner) / n, sum(v for _, v in inner) / n
        var = sum((x - mx) ** 2 for x, _ in inner)
        a = sum((x - mx) * (v - ms) for x, v in inner) / var if var else 0.0
        b = a * mx - ms
        if a > 0 and b > 0:
            candidates.append((f, 1.0, round(1.0 + 1.0 / b, 6), round(a / b)))
    for factor, low, high, ctx in candidates:
        want = llama3_divisors(theta, dim, factor, low, high, ctx)
        if len(want) == len(divisors) and all(
            abs(x - y) < 1e-4 * max(1.0, y) for x, y in zip(want, divisors, strict=True)
        ):
            return {"rope_type": "llama3", "factor": factor, "low_freq_factor": low,
                    "high_freq_factor": high, "original_max_position_embeddings": ctx}  # fmt: skip
    return None


def _field(reader, key):
    field = reader.fields.get(key)
    if field is None:
        return None
    value = field.contents()
    return value.decode() if isinstance(value, bytes) else value


def _tensor(reader, name):
    found = [t for t in reader.tensors if t.name == name]
    return None if not found else [float(v) for v in found[0].data.reshape(-1)]


def _yarn_keys(reader, arch: str) -> dict:
    """YaRN's band edges and, from `yarn_log_mul` (DeepSeek's and Ministral 3's
    mscale_all_dim), its attention factor mscale(factor, 1) / mscale(factor, log_mul), as
    llama.cpp computes it (llama-context.cpp, which takes mscale as 1): without it the
    factor would be mscale(factor, 1), 1.28 at Ministral 3's 16 where theirs is 1."""
    keys = {}
    for key, name in (("beta_fast", "beta_fast"), ("beta_slow", "beta_slow")):
        value = _field(reader, f"{arch}.rope.scaling.yarn_{key}")
        if value is not None:
            keys[name] = float(value)
    log_mul = _field(reader, f"{arch}.rope.scaling.yarn_log_multiplier")
    if log_mul and arch == "deepseek2":  # its converter writes 0.1 × mscale_all_dim, and
        # its graph scales the scores by mscale(factor, that)²: DeepSeek's configs, whose
        # mscale equals mscale_all_dim (V2's 0.707, V3's 1)
        keys.update(mscale=float(log_mul) * 10, mscale_all_dim=float(log_mul) * 10)
    elif log_mul:
        keys.update(mscale=1.0, mscale_all_dim=float(log_mul))
    return keys


def gguf_rope(reader, arch: str, config, path_name: str) -> dict:
    """The config fields the file's rope scaling sets ({} without one): rope_parameters in
    the config's own form (gemma3: the global layers' entry; the local ones keep theirs),
    and LongRoPE's original context."""
    kind = _field(reader, f"{arch}.rope.scaling.type")
    factor = _field(reader, f"{arch}.rope.scaling.factor")
    original = _field(reader, f"{arch}.rope.scaling.original_context_length")
    divisors = _tensor(reader, "rope_freqs.weight")
    long_f, short_f = (
        _tensor(reader, "rope_factors_long.weight"),
        _tensor(reader, "rope_factors_short.weight"),
    )
    rope = dict(config.rope_parameters or {})
    nested = "full_attention" in rope
    base = dict(rope["full_attention"] if nested else rope)
    theta = float(base.get("rope_theta", 10000.0))
    found = None
    if divisors is not None:
        head_dim = (
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        )
        found = _llama3(divisors, theta, head_dim)
        if found is None:
            raise LlmpressError(
                f"{path_name} stores a rope_freqs tensor (llama3 rope scaling) whose values "
                "no llama3 setting reproduces; compress the model's Hugging Face checkpoint "
                "instead"
            )
    elif long_f is not None and short_f is not None:
        if original is None:
            raise LlmpressError(
                f"{path_name} has LongRoPE factors but no original context length; compress "
                "the model's Hugging Face checkpoint instead"
            )
        found = {"rope_type": "longrope", "long_factor": long_f, "short_factor": short_f}
    elif kind in (None, "none"):
        return {}
    elif kind == "linear" and factor:
        found = {"rope_type": "linear", "factor": float(factor)}
    elif kind == "yarn" and factor and original:
        found = {"rope_type": "yarn", "factor": float(factor),
                 "original_max_position_embeddings": int(original),
                 **_yarn_keys(reader, arch)}  # fmt: skip
    else:
        raise LlmpressError(
            f"{path_name} uses rope scaling {kind!r}, which llmpress cannot read from a GGUF "
            "file; compress the model's Hugging Face checkpoint instead"
        )
    found = {**base, **found, "rope_theta": theta}  # partial_rotary_factor kept
    fields = {"rope_parameters": {**rope, "full_attention": found} if nested else found}
    if found["rope_type"] == "longrope":
        fields["original_max_position_embeddings"] = int(original)
    return fields
