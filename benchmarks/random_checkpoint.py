"""Random-weight checkpoints of real models' shapes, written tensor by tensor.

A 7B-shaped checkpoint is 15 GB of bf16: more than fits comfortably in these machines'
memory next to the process that compresses it. So nothing here builds the model: the
safetensors header is computed from the shapes, then each tensor is drawn (normal, std
0.02; norms at 1) and appended (compress's own streaming writer), in shards of at most
5 GB with an index, the way the hub stores them. The tokenizer is the default model's
(its vocabulary is a prefix of every shape's here).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch

from compress.artifact.stream_safetensors import write_produced

SHARD_BYTES = 5 * 10**9


@dataclass(frozen=True)
class Shape:
    """The facts of a model's shape that decide bytes and compute."""

    model_type: str  # llama, qwen2 or qwen3_moe
    hidden: int
    layers: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool
    qkv_bias: bool = False
    config: dict = field(default_factory=dict)  # anything else config.json carries
    head_width: int = 0  # head_dim where it is not hidden / heads
    # qwen3_moe: `experts` of width `intermediate` in every layer, `top_k` a token
    experts: int = 0
    top_k: int = 0

    @property
    def head_dim(self) -> int:
        return self.head_width or self.hidden // self.heads


LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
SHAPES = {
    "smollm2-135m": Shape(
        "llama", 576, 30, 1536, 9, 3, 49152, True, config={"max_position_embeddings": 8192}
    ),
    "qwen2.5-0.5b": Shape(  # a tied head of 151,936 rows: 28% of the weights
        "qwen2", 896, 24, 4864, 14, 2, 151936, True, qkv_bias=True,
        config={"rope_theta": 1000000.0, "max_position_embeddings": 32768},
    ),
    "llama-3.2-1b": Shape(
        "llama", 2048, 16, 8192, 32, 8, 128256, True,
        config={"rope_theta": 500000.0, "rope_scaling": LLAMA3_ROPE,
                "max_position_embeddings": 131072},
    ),
    "qwen2.5-7b": Shape(
        "qwen2", 3584, 28, 18944, 28, 4, 152064, False, qkv_bias=True,
        config={"rope_theta": 1000000.0, "max_position_embeddings": 32768},
    ),
    "llama-3-8b": Shape(
        "llama", 4096, 32, 14336, 32, 8, 128256, False,
        config={"rope_theta": 500000.0, "max_position_embeddings": 8192},
    ),
    "qwen3-30b-a3b": Shape(  # 128 experts of 768, 8 a token; q/k norms per head
        "qwen3_moe", 2048, 48, 768, 32, 4, 151936, False, head_width=128, experts=128,
        top_k=8, config={"rope_theta": 1000000.0, "max_position_embeddings": 40960},
    ),
}  # fmt: skip


def tensor_shapes(s: Shape) -> dict[str, tuple[int, ...]]:
    """Every tensor of the checkpoint, in the order a hub checkpoint stores them."""
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (s.vocab, s.hidden)}
    for i in range(s.layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = (s.hidden,)
        for name, rows in (("q", q), ("k", kv), ("v", kv)):
            out[p + f"self_attn.{name}_proj.weight"] = (rows, s.hidden)
            if s.qkv_bias:
                out[p + f"self_attn.{name}_proj.bias"] = (rows,)
        if s.experts:
            out[p + "self_attn.q_norm.weight"] = out[p + "self_attn.k_norm.weight"] = (s.head_dim,)
        out[p + "self_attn.o_proj.weight"] = (s.hidden, q)
        out[p + "post_attention_layernorm.weight"] = (s.hidden,)
        mlps = [f"mlp.experts.{e}." for e in range(s.experts)] if s.experts else ["mlp."]
        if s.experts:
            out[p + "mlp.gate.weight"] = (s.experts, s.hidden)
        for mlp in mlps:
            out[p + mlp + "gate_proj.weight"] = (s.intermediate, s.hidden)
            out[p + mlp + "up_proj.weight"] = (s.intermediate, s.hidden)
            out[p + mlp + "down_proj.weight"] = (s.hidden, s.intermediate)
    out["model.norm.weight"] = (s.hidden,)
    if not s.tied:
        out["lm_head.weight"] = (s.vocab, s.hidden)
    return out


def config_json(s: Shape) -> dict:
    arch = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
            "qwen3_moe": "Qwen3MoeForCausalLM"}[s.model_type]  # fmt: skip
    moe = {
        "num_experts": s.experts,
        "num_experts_per_tok": s.top_k,
        "moe_intermediate_size": s.intermediate,
        "norm_topk_prob": True,
        "head_dim": s.head_dim,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
    }
    return {
        "architectures": [arch],
        "model_type": s.model_type,
        "hidden_size": s.hidden,
        "num_hidden_layers": s.layers,
        "intermediate_size": s.intermediate,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads,
        "vocab_size": s.vocab,
        "tie_word_embeddings": s.tied,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5 if s.model_type == "llama" else 1e-6,
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
        **({"attention_bias": False, "mlp_bias": False} if s.model_type == "llama" else {}),
        **(moe if s.experts else {}),
        **s.config,
    }


def write(shape: Shape, folder: Path, tokenizer_from: Path, seed: int = 0) -> Path:
    """Write `shape` with random bf16 weights into `folder` (created; sharded at 5 GB)."""
    return _write(tensor_shapes(shape), config_json(shape), folder, tokenizer_from, seed)


def config_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor a checkpoint of config.json `config` holds, named and shaped as
    transformers' own model of it has them (experts one by one, as checkpoints store
    them): any family llmpress reads, without a Shape of its own here."""
    from transformers import AutoConfig

    from compress.model.gguf_tensors import checkpoint_shapes

    clean = {k: v for k, v in config.items() if k != "architectures"}
    return checkpoint_shapes(AutoConfig.for_model(**clean))


def write_config(config: dict, folder: Path, tokenizer_from: Path, seed: int = 0) -> Path:
    """Write a checkpoint of config.json `config` with random bf16 weights (config_shapes)."""
    return _write(config_shapes(config), config, folder, tokenizer_from, seed)


def _write(shapes: dict, config: dict, folder: Path, tokenizer_from: Path, seed: int) -> Path:
    gen = torch.Generator().manual_seed(seed)

    def produce(name: str) -> torch.Tensor:
        dims = shapes[name]
        if name.endswith("norm.weight"):
            return torch.ones(dims, dtype=torch.bfloat16)
        out = torch.empty(dims, dtype=torch.bfloat16)
        rows = max(1, (64 << 20) // (4 * (dims[-1] if len(dims) > 1 else 1)))
        for lo in range(0, dims[0], rows):  # 64 MB of fp32 at a time
            part = out[lo : lo + rows]
            part.copy_(torch.randn(part.shape, generator=gen) * 0.02)
        return out

    folder.mkdir(parents=True)
    specs = [(name, "BF16", list(dims)) for name, dims in shapes.items()]
    write_produced(folder, specs, produce, SHARD_BYTES)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    for f in tokenizer_from.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")) or f.suffix == ".jinja":
            shutil.copy2(f, folder / f.name)
    return folder


def parameters(shape: Shape) -> int:
    return sum(int(torch.tensor(d).prod()) for d in tensor_shapes(shape).values())
