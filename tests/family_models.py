"""Tiny seeded models of every supported family, built from transformers' own config
classes and saved as safetensors folders (what a user's checkpoint looks like).

Each exercises what sets its family apart: Llama 3 rope scaling and an untied head,
Mistral's sliding window, qwen2's q/k/v biases with YaRN, qwen3's qk-norm with a sliding
upper layer, gemma3's (1+w) sandwich norms, scaled embedding, attention scalar, softcap
and local/global rope, phi3's fused tensors with partial rotary LongRoPE. Norm weights and
biases are drawn at random (transformers initializes them to ones or zeros, which would
hide a skipped norm or bias), and the default model's tokenizer is copied in so the CLI
can decode.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

COMMON = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 49152,
    "max_position_embeddings": 512,
    "initializer_range": 0.08,
    "tie_word_embeddings": False,
}

FAMILIES = {
    "llama3": (
        "LlamaConfig",
        {
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
            "rms_norm_eps": 1e-5,
        },
    ),
    "mistral": ("MistralConfig", {"sliding_window": 8}),
    "qwen2": (
        "Qwen2Config",
        {
            "rope_parameters": {
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 128,
            },
        },
    ),
    "qwen3": (
        "Qwen3Config",
        {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1},
    ),
    "gemma3_text": (
        "Gemma3TextConfig",
        {
            "layer_types": ["sliding_attention", "full_attention"],
            "sliding_window": 8,
            "query_pre_attn_scalar": 24,
            "final_logit_softcapping": 3.0,
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            },
            "tie_word_embeddings": True,
        },
    ),
    "phi3": (
        "Phi3Config",
        {
            "max_position_embeddings": 256,
            "original_max_position_embeddings": 32,
            "rope_parameters": {
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.5,
                "short_factor": [1.0, 1.3, 1.9, 2.5],
                "long_factor": [1.2, 2.0, 3.5, 6.0],
            },
            "pad_token_id": 0,
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
    ),
}


def family_config(name: str, **overrides):
    import transformers

    cls_name, settings = FAMILIES[name]
    return getattr(transformers, cls_name)(**{**COMMON, **settings, **overrides})


def build_family(name: str, seed: int = 0, **overrides):
    """The transformers model (fp32, eval, eager attention) of a tiny `name` model."""
    from transformers import AutoModelForCausalLM

    config = family_config(name, **overrides)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight"):
                offset = 0.0 if name.startswith("gemma") else 1.0
                p.copy_(offset + 0.3 * torch.randn_like(p))
            elif pname.endswith(".bias"):
                p.copy_(0.2 * torch.randn_like(p))
    return model


def write_family(folder: Path, name: str, tokenizer_from: Path | None = None, **overrides):
    """Save the tiny `name` model as a checkpoint folder (and copy a tokenizer in)."""
    model = build_family(name, **overrides)
    model.save_pretrained(folder)
    if tokenizer_from is not None:
        for f in tokenizer_from.iterdir():
            if f.name.startswith(("tokenizer", "special_tokens")) or f.suffix == ".jinja":
                shutil.copy2(f, folder / f.name)
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == model.config.model_type
    return folder


# Widths above the default group of 64, so every expert linear takes one scheme (a group
# as wide as the input is written per-channel, which transformers' expert merge refuses
# beside grouped siblings).
MOE_FAMILIES = {
    "qwen3_moe": (
        "Qwen3MoeConfig",
        {
            "hidden_size": 128,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 128,
            "norm_topk_prob": True,
        },
    ),
    "mixtral": (
        "MixtralConfig",
        {"hidden_size": 128, "num_local_experts": 4, "num_experts_per_tok": 2},
    ),
}
FAMILIES.update(MOE_FAMILIES)
