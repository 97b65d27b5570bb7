"""Every supported family at a realistic width: compressed with the README's recipe,
opened by plain transformers, checked against vLLM's loading rules, run against
transformers' logits, and decoded in `llmpress bench`; then the two speed anchors the
family issue names.

Rows (one per family, random weights of about 0.5B parameters, bf16, made here):
- dense families: Qwen2.5-0.5B's widths (hidden 896, 24 layers, MLP 4864, 14/2 heads,
  head_dim 64, vocab 151,936), each with its own family's features (llama: Llama 3 rope
  scaling, untied head; mistral and qwen3: a sliding window; gemma3: 5 local : 1 global
  layers, its scales; gemma2: 1 local : 1 global, its attention and final softcaps;
  smollm3: every 4th layer without rope; granite: its four multipliers; olmo2: norms on
  the branch outputs only, q/k norms over all heads; olmo3: those with 3 sliding : 1
  full layers, YaRN on the full ones; exaone4: olmo2's norms, per-head q/k norms, 3
  sliding : 1 full layers, the full ones without rope; glm4: sandwich norms, fused
  gate/up, q/k/v biases, half of each head rotated in interleaved pairs; ernie4_5: the
  whole head rotated so, tied head; glm: glm4 without the output norms; helium: llama's
  block, no GQA, the whole head rotated in interleaved pairs; seed_oss: llama's block,
  q/k/v biases; ministral3: mistral's block, YaRN; hunyuan_v1_dense: per-head q/k norms
  after rope, NTK-alpha rope; cohere: one LayerNorm feeding attention and MLP in
  parallel, interleaved rope, logit scale, tied head; cohere2: those with 3 sliding : 1
  full layers, the full ones without rope; arcee: an MLP without a gate, relu²; apertus:
  the same with xIELU, per-head q/k norms; starcoder2: LayerNorms with a bias, biased
  gelu MLP without a gate, tied head; nemotron: LayerNorm1P with a bias, relu² MLP without
  a gate, half of each head rotated; gemma: (1+w) norms, scaled embedding, tied head; phi:
  the parallel block under one LayerNorm with a bias, biased gelu MLP without a gate and
  head; stablelm: LayerNorms with a bias, q/k/v biases, a quarter of each head rotated;
  phi3: fused tensors, LongRoPE; vaultgemma: gemma2's block without the output norms;
  ministral: mistral's block, 1 sliding : 1 full layers; hyperclovax: granite's
  multipliers, the logits multiplied, norms on the branch outputs; granite_swa: granite's
  multipliers, 3 sliding : 1 full layers, the full ones without rope, an attention sink
  per head; apertus1p5_text: apertus's block, the head over a third of the embedding's
  rows; internlm3 and iquestcoder:
  llama's block, internlm3's biased; cwm: 1 full : 3 sliding layers, Llama 3 rope
  scaling; jais2: LayerNorms with a bias, relu² MLP without a gate, every linear biased;
  qwen3_5_text: 3 Gated DeltaNet layers (16 key and 16 value heads of 128) : 1 full
  attention layer whose q is gated per head, a quarter of each head rotated, (1+w) norms;
  bamba: 7 Mamba-2 layers (28 heads of 64, one group, a state of 128, as Bamba-9B's
  widths scale) : 1 llama attention layer, half of each head rotated; lfm2: 2 gated
  short convolutions (kernel 3) : 1 attention layer with per-head q/k norms, the MLP's
  width by LFM2's rule; jamba: 7 Mamba layers (a state of 16, dt of rank 56, as Jamba's
  widths scale) : 1 attention layer without rope);
- MoE families: hidden 1024, 16 layers, 8 experts of width 1024, top-2 (qwen3_5_moe_text
  with qwen3_5_text's layers and qwen2_moe's gated shared expert of width 1024; qwen3_next
  the same with its DeltaNets' projections grouped by key head; mixtral's own
  renormalized routing; qwen3_moe with norm_topk_prob; qwen2_moe with q/k/v biases and a
  shared expert of width 2048, gated; olmoe unrenormalized, with q/k norms over all
  heads; glm4_moe with sigmoid routing steered by a choice bias, scaled by 2.5, an
  ungated shared expert of width 1024 and layer 0 dense, 4096 wide; ernie4_5_moe with
  softmax routing steered by a choice bias, the same shared expert and dense layer 0;
  minimax_m2 with sigmoid routing steered by a choice bias, q/k norms over all heads and
  half of each head rotated; dots1 with glm4_moe's routing, shared expert and dense layer
  0 under qwen3's per-head q/k norms; flex_olmo with olmo2's output-only norms and q/k
  norms over all heads around olmoe's experts; hunyuan_v1_moe with softmax routing,
  renormalized, an ungated shared MLP as wide as an expert and q/k norms after rope;
  phimoe with sparsemixer routing, LayerNorms with a bias, biased q/k/v/o and head and
  LongRoPE at its published mscale;
  afmoe with sandwich norms, per-head q/k norms and the attention's output gated by a
  sigmoid, 3 sliding : 1 full layers, the full ones without rope, sigmoid routing
  steered by a choice bias, renormalized and scaled, a shared expert and layer 0 dense;
  cohere2_moe with the parallel block under one LayerNorm, softmax routing, a shared
  expert averaged with the routed ones, layer 0 dense and rotated, 3 sliding : 1 full
  layers after it, the full ones unrotated;
  minicpm5_moe with the gate's rows inside q, every attention linear biased, glm4_moe's
  routing and shared expert, layer 0 dense;
  flint with qwen3_moe's attention and a sink per head, rope on the sliding layers only,
  sigmoid routing renormalized, an ungated shared expert and layer 0 dense;
  exaone_moe with dots1's routing, shared expert, dense layer 0 and q/k norms, 3
  sliding : 1 full layers, the full ones without rope;
  mellum with qwen3_moe's block, layer 0 dense and 4096 wide, 1 sliding : 1 full layers,
  a rope base each; solar_open with glm4_moe's routing and shared expert in every layer
  under llama's attention).
Columns: `llmpress compress --quant rtn:w4g64` (the README's command) succeeds; the
runtime's exact logits against transformers' forward on the artifact's weights in fp32
(max |diff| over 72 tokens); `AutoModelForCausalLM.from_pretrained(artifact)` loads, and
its logits' max |diff| to the runtime's (for MoE transformers keeps the dequantized fused
experts in bf16, so that figure is bf16 rounding); the manifest's vLLM verdict; and
`llmpress bench --batch 1` decode tokens/s and MBU (bytes actually read: for MoE, the
experts routing chose), the median of `--rounds` runs, each round benching every family
once. Every row's MBU divides by one ceiling, the highest memory bandwidth any of the
run's bench calls measured (each measures its own, which moved between 31 and 63 GB/s
from row to row on a shared host: divided by its own, two rows at one speed read 45% and
79%). AWQ and GPTQ per family are covered at
tiny width by tests/test_families.py (their KL is printed here from the tiny models too).

Anchors, rounds interleaved (medians): the qwen2 row against the same shape without
biases (llama, same widths: the one-call C decoder now takes biases), and against
llama.cpp (`--llama-cpp BIN`: its own convert_hf_to_gguf.py next to BIN/../../src, then
`llama-quantize Q4_0`, `llama-bench -t 2 -p 0 -n 64 -r 1`), with the README's recipe
(whose `--lm-head auto` stores this untied head in int8) and with `--lm-head none`.

    scripts/build_llama_cpp            # prints BIN
    python benchmarks/families.py --llama-cpp BIN [--rounds 3] [--out benchmarks/results] \
        [--name families] [--llama-cflags FLAGS]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tests"))

from batched_decode import cpu_flags  # noqa: E402
from family_models import COMMON, FAMILIES, HYBRID_FAMILIES, MOE_FAMILIES  # noqa: E402
from llama_server import add_cflags_argument  # noqa: E402

from compress.model.default import convert_gguf, default_gguf  # noqa: E402

LLMPRESS = [sys.executable, "-m", "compress"]
QWEN05 = {
    "hidden_size": 896,
    "num_hidden_layers": 24,
    "intermediate_size": 4864,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": 151936,
    "max_position_embeddings": 4096,
    "initializer_range": 0.02,
}
# Qwen3.5's Gated DeltaNet at the published Qwen3.5 sizes but for the widths (16 key and
# 16 value heads of 128), 3 DeltaNet layers : 1 full attention layer (whose heads are the
# table's, each q gated)
_DELTANET = {
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 16,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "layer_types": None,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0,
                        "partial_rotary_factor": 0.25},
}  # fmt: skip
DENSE = {
    "qwen3_5_text": _DELTANET,
    "jamba": {  # Jamba's 1 attention layer in 8, its Mamba at this width, no experts
        "attn_layer_period": 8,
        "attn_layer_offset": 4,
        "num_experts": 1,
        "mamba_d_state": 16,
        "mamba_dt_rank": 56,
    },
    "lfm2": {  # LFM2's third of attention layers (LFM2-350M: 6 of 16), kernel 3
        "layer_types": ["full_attention" if i % 3 == 2 else "conv" for i in range(24)],
        "conv_L_cache": 3,
        "block_multiple_of": 256,
    },
    "bamba": {  # Bamba-9B's Mamba at this width (its expand of 2), 3 attention layers of 24
        "mamba_n_heads": 28,
        "mamba_d_head": 64,
        "mamba_n_groups": 1,
        "mamba_d_state": 128,
        "mamba_chunk_size": 256,
        "attn_layer_indices": [7, 15, 23],
    },
    "llama3": {  # Llama 3.1's rope scaling, its original context scaled to this one
        "rope_parameters": {
            **FAMILIES["llama3"][1]["rope_parameters"],
            "original_max_position_embeddings": 1024,
        }
    },
    "mistral": {"sliding_window": 512},
    "qwen2": {"rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}},
    "qwen3": {"use_sliding_window": True, "sliding_window": 512, "max_window_layers": 12},
    "gemma3_text": {
        "layer_types": None,
        "sliding_window": 512,
        "query_pre_attn_scalar": 64,
        "final_logit_softcapping": None,
        "rope_parameters": None,
        "tie_word_embeddings": True,
    },
    "smollm3": {"no_rope_layers": None},  # the class's: every 4th layer without rope
    "gemma2": {  # its published softcaps, 1 local : 1 global layers
        "layer_types": None,
        "sliding_window": 512,
        "query_pre_attn_scalar": 64,
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
        "tie_word_embeddings": True,
    },
    "granite": {  # granite-3's scalars (the tiny model's), the attention one for head_dim 64
        "attention_multiplier": 1 / 64,
        "tie_word_embeddings": True,
    },
    "olmo2": {},  # its output-only norms and whole-width q/k norms come with the class
    "olmo3": {  # the class's 3 sliding : 1 full layers; YaRN on the full ones, as Olmo 3's
        "layer_types": None,
        "sliding_window": 512,
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 500000.0},
            "full_attention": {
                "rope_type": "yarn",
                "rope_theta": 500000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 1024,
            },
        },
    },
    "exaone4": {"layer_types": None, "sliding_window": 512},  # 3 sliding : 1 full, NoPE
    "glm4": {},  # its sandwich norms, fused gate/up, q/k/v biases and interleaved rope
    "ernie4_5": {},  # llama's block, the whole head rotated in interleaved pairs, tied head
    "glm": {},  # glm4 without its output norms
    "helium": {"num_attention_heads": 14, "num_key_value_heads": 14},  # no GQA (its class's)
    "seed_oss": {"attention_out_bias": False, "mlp_bias": False},  # Seed-OSS-36B's: q/k/v only
    # Hunyuan-7B's NTK-alpha rope (alpha 1000: the base times 1000^(64/62)); its per-head
    # q/k norms after rope come with the class
    "hunyuan_v1_dense": {
        "rope_parameters": {
            "rope_type": "dynamic",
            "rope_theta": 10000.0,
            "alpha": 1000.0,
            "factor": 1.0,
        },
    },
    "arcee": {"mlp_bias": False},  # AFM-4.5B's: relu² MLP without a gate, no biases
    "apertus": {},  # xIELU MLP without a gate (its initial parameters), per-head q/k norms
    # Apertus 1.5's: apertus's block, the head over the first 49,152 ids (the tokenizer's
    # words) of the 151,936-row embedding, as its head leaves out the image and audio codes
    "apertus1p5_text": {"output_vocab_size": 49152},
    "starcoder2": {"tie_word_embeddings": True},  # StarCoder2's biases, LayerNorms, window
    "nemotron": {},  # LayerNorm1P with a bias, relu² MLP without a gate, half the head rotated
    "gemma": {"tie_word_embeddings": True},  # (1+w) norms, scaled embedding, tied head
    "phi": {},  # parallel block, LayerNorm with a bias, biased gelu MLP and head, half rotated
    "stablelm": {"use_qkv_bias": True},  # StableLM 2 1.6B's: LayerNorms with a bias
    # Pythia's: multi-head, q/k/v fused head by head, two norms in parallel, exact gelu
    "gpt_neox": {"num_key_value_heads": 14},
    # Command R's logit scale and tied head; Command R7B's (0.25), its class's 3 sliding :
    # 1 full layers, the full ones without rope
    "cohere": {"logit_scale": 0.0625, "tie_word_embeddings": True, "use_qk_norm": False},
    "cohere2": {
        "layer_types": None,
        "sliding_window": 512,
        "logit_scale": 0.25,
        "tie_word_embeddings": True,
    },
    # Ministral 3's class rope: YaRN 16x over 16,384 tokens, Llama 4's query temperature
    # (beta 0.1) past them, so not at these lengths (the tests run it at 16 tokens)
    "ministral3": {"rope_parameters": None, "max_position_embeddings": 262144},
    # VaultGemma's: gemma2's block without the output norms, 1 sliding : 1 full layers
    "vaultgemma": {"layer_types": None, "sliding_window": 512, "tie_word_embeddings": True},
    # Ministral-8B's: mistral's block, its sliding layers listed (here 1 : 1)
    "ministral": {
        "sliding_window": 512,
        "layer_types": ["sliding_attention", "full_attention"] * 12,
    },
    # InternLM3's and IQuest-Coder's: llama's block (InternLM3 with its biases on, as the
    # tiny model), Jais-2's: LayerNorms with biases, relu² MLP without a gate, every linear
    # biased
    "internlm3": {},
    # HyperCLOVA X's: granite's multipliers (the tiny model's), the logits multiplied,
    # Peri-LN's norms on the branch outputs
    "hyperclovax": {},
    # Granite SWASH's: granite's multipliers (as the granite row's), 3 sliding layers of
    # its class's 128 : 1 full layer, each head's attention sink (drawn at random in
    # write_model); the full layers without rope (layer_rope_theta 0), chosen here
    "granite_swa": {
        "attention_multiplier": 1 / 64,
        "tie_word_embeddings": True,
        "layer_types": None,
        "sliding_window": 128,
        "num_hidden_layers": 24,
        "layer_rope_theta": [0 if i % 4 == 0 else 10000.0 for i in range(24)],
    },
    "iquestcoder": {},
    "jais2": {},
    # Code World Model's: 1 full : 3 sliding layers, Llama 3 rope scaling at its class
    # default, the original context scaled to this one
    "cwm": {
        "sliding_window": 512,
        "layer_types": None,
        "rope_parameters": {
            **FAMILIES["cwm"][1]["rope_parameters"],
            "original_max_position_embeddings": 1024,
        },
    },
    "phi3": {
        "original_max_position_embeddings": 1024,
        "rope_parameters": {
            "rope_type": "longrope",
            "rope_theta": 10000.0,
            "short_factor": [1.0] * 32,
            "long_factor": [2.0] * 32,
        },
    },
}
MOE = {
    "hidden_size": 1024,
    "num_hidden_layers": 16,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "vocab_size": 49152,
    "initializer_range": 0.02,
}
MOE_SETTINGS = {
    "qwen3_moe": {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 1024},
    # qwen3_5_moe_text: the DeltaNet layers above, qwen2_moe's gated shared expert
    "qwen3_5_moe_text": {
        **_DELTANET,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 1024,
        "shared_expert_intermediate_size": 1024,
    },
    # qwen3_next: the same, each DeltaNet's projections stored grouped by key head
    "qwen3_next": {
        **_DELTANET,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 1024,
        "shared_expert_intermediate_size": 1024,
        "norm_topk_prob": True,
        "mlp_only_layers": [],
    },
    "mixtral": {"num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 1024},
    # glm4_moe: GLM-4.5-Air's routing (sigmoid scores steered by a choice bias,
    # renormalized, times the published 2.5), one shared expert, per-head q/k norms, q/k/v
    # biases, layer 0 dense and 4x an expert wide
    "glm4_moe": {  # and the tiny model's routing, shared expert, norms and biases
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 1024,
        "intermediate_size": 4096,
    },
    "ernie4_5_moe": {  # and the tiny model's routing, shared expert and rope
        "moe_num_experts": 8,
        "moe_k": 2,
        "moe_intermediate_size": 1024,
        "intermediate_size": 4096,
    },
    # dots1: glm4_moe's experts and dense layer 0 under qwen3's attention, every layer
    # full as dots.llm1's (max_window_layers = its depth)
    "dots1": {
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 1024,
        "intermediate_size": 4096,
        "max_window_layers": 16,
    },
    # minimax_m2: MiniMax-M2's sigmoid routing steered by a choice bias, q/k norms over all
    # heads, half of each head rotated (its published 64 of 128)
    "minimax_m2": {
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "intermediate_size": 1024,
        "rotary_dim": 32,
    },
    # mellum: qwen3_moe's block, layer 0 dense (mlp_layer_types), 1 sliding : 1 full
    # layers with a rope base each
    "mellum": {
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 1024,
        "intermediate_size": 4096,
        "mlp_layer_types": ["dense"] + ["sparse"] * 15,
        "layer_types": ["sliding_attention", "full_attention"] * 8,
        "sliding_window": 512,
    },
    # cohere2_moe: Command A+'s parallel block with experts, layer 0 dense (typed full,
    # rotated) and 4096 wide, then 3 sliding : 1 full layers (the full ones unrotated), the
    # shared expert averaged with the routed ones
    "cohere2_moe": {
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "intermediate_size": 1024,
        "prefix_dense_intermediate_size": 4096,
        "mlp_layer_types": ["dense"] + ["sparse"] * 15,
        "layer_types": ["full_attention"]
        + (["sliding_attention"] * 3 + ["full_attention"]) * 3
        + ["sliding_attention"] * 3,
        "sliding_window": 512,
    },
    # minicpm5_moe: MiniCPM5-MoE's q_proj holding each head's query and output gate,
    # biased attention, V3's routing, a shared expert, layer 0 dense
    "minicpm5_moe": {
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 1024,
        "intermediate_size": 4096,
        "mlp_layer_types": ["dense"] + ["sparse"] * 15,
    },
    # afmoe: Trinity's sandwich norms, per-head q/k norms and attention output gate, 3
    # sliding : 1 full layers (the full ones without rope), sigmoid routing steered by a
    # choice bias, renormalized and scaled, a shared expert, layer 0 dense, muP's embedding
    "afmoe": {
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 1024,
        "intermediate_size": 4096,
        "global_attn_every_n_layers": 4,
        "sliding_window": 512,
    },
    # exaone_moe: K-EXAONE's DeepSeek-V3 routing, shared expert and layer 0 dense under
    # per-head q/k norms, 3 sliding : 1 full layers, the full ones without rope
    "exaone_moe": {
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 1024,
        "intermediate_size": 4096,
        "mlp_layer_types": ["dense"] + ["sparse"] * 15,
        "layer_types": (["sliding_attention"] * 3 + ["full_attention"]) * 4,
        "sliding_window": 512,
    },
    # solar_open: glm4_moe's routing and shared expert in every layer under llama's attention
    "solar_open": {"n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 1024},
    # flex_olmo: olmo2's block with olmoe's experts, renormalized (FlexOlmo's norm_topk_prob)
    "flex_olmo": {"num_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 1024},
    # hunyuan_v1_moe: Hunyuan-A13B's softmax routing, renormalized, an ungated shared MLP as
    # wide as an expert, q/k norms after rope and its NTK-alpha rope (the tiny model's)
    "hunyuan_v1_moe": {"num_experts": 8, "moe_topk": 2, "intermediate_size": 1024},
    # phimoe: Phi-3.5-MoE's sparsemixer routing (its published threshold), LayerNorms with
    # a bias, biased q/k/v/o and head, LongRoPE at its published mscale (the tiny model's
    # factors stretched to the head)
    "phimoe": {
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "intermediate_size": 1024,
        "max_position_embeddings": 131072,
        "rope_parameters": {
            "rope_type": "longrope",
            "rope_theta": 10000.0,
            "short_factor": [1.0 + 0.05 * i for i in range(32)],
            "long_factor": [1.0 + 0.3 * i for i in range(32)],
            "short_mscale": 1.243163121016122,
            "long_mscale": 1.243163121016122,
            "original_max_position_embeddings": 4096,
        },
    },
    # olmoe: OLMoE's routing (no renormalization) and q/k norms over all heads
    "olmoe": {"num_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 1024},
    "qwen2_moe": {  # and a shared expert twice as wide, as Qwen1.5-MoE's is 4 experts wide
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 1024,
        "shared_expert_intermediate_size": 2048,
    },
    # flint: Flint's attention (per-head q/k norms, a sink per head drawn in write_model),
    # its class's full layers (the first two, every fourth from 1, the last) without rope and
    # sliding ones of 512, sigmoid routing renormalized, an ungated shared expert as wide as
    # one, layer 0 dense (its 4096-wide intermediate_size)
    "flint": {
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 1024,
        "shared_expert_intermediate_size": 1024,
        "intermediate_size": 4096,
        "mlp_only_layers": [0],
        "layer_types": None,
        "sliding_window": 512,
    },
    # hy_v3: Hy3's per-head q/k norms, sigmoids chosen with a bias (drawn in write_model),
    # renormalized and scaled, a gated shared expert as wide as one; layer 0 dense (4096)
    "hy_v3": {
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 1024,
        "num_shared_experts": 1,
        "intermediate_size": 4096,
    },
    # kolibri1: Kolibri-1's attention (per-head q/k norms; its class's 4 sliding of 512 : 1
    # full layers, the full ones without rope) in a sandwich of norms, experts in every
    # layer chosen by logit plus a bias and weighted by sigmoids, a gated shared expert as
    # wide as one
    "kolibri1": {
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 1024,
        "shared_expert_intermediate_size": 1024,
        "layer_types": None,
        "sliding_window": 512,
    },
}


def realistic_config(name: str):
    import transformers

    cls_name, tiny = {**FAMILIES, **HYBRID_FAMILIES, **MOE_FAMILIES}[name]
    if name in MOE_SETTINGS:
        settings = {**COMMON, **tiny, **MOE, **MOE_SETTINGS[name]}
    else:
        settings = {**COMMON, **tiny, **QWEN05, **DENSE[name]}
    # gemma3: the class derives its 5:1 layer pattern and nested rope from its defaults
    settings = {k: v for k, v in settings.items() if v is not None}
    settings.setdefault("tie_word_embeddings", False)
    return getattr(transformers, cls_name)(**settings)


def write_model(folder: Path, name: str, config=None, seed: int = 0) -> Path:
    """Random weights (bf16) of `name` at realistic width, with the default model's
    tokenizer (its vocabulary is a prefix of the model's)."""
    from transformers import AutoModelForCausalLM

    config = config or realistic_config(name)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    with torch.no_grad():  # afmoe's router starts at zeros: every expert tied, chosen by
        for pname, p in model.named_parameters():  # each engine's tie-breaking
            if pname.endswith("mlp.router.gate.weight") and not p.any():
                p.normal_(0.0, config.initializer_range)
            if pname.endswith("self_attn.sinks"):  # granite_swa's at zeros, each head's
                p.normal_(0.0, 1.0)  # alike
        for bname, b in model.named_buffers():  # a choice bias at zeros steers nothing
            if bname.endswith("e_score_correction_bias") and not b.any():  # (a trained
                b.normal_(0.0, 0.1)  # one does: Kolibri-1's chooses by logit plus it)
    model.save_pretrained(folder)
    tokenizer = convert_gguf(default_gguf())
    for f in tokenizer.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")) or f.suffix == ".jinja":
            shutil.copy2(f, folder / f.name)
    return folder


def run(cmd, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, check=True, **kw)


def compress_cli(src: Path, out: Path, *extra: str) -> float:
    t = time.perf_counter()
    run([*LLMPRESS, "compress", str(src), "-o", str(out), "--quant", "rtn:w4g64", *extra])
    return time.perf_counter() - t


def bench_cli(artifact: Path, work: Path) -> tuple[float, float, float]:
    """One `llmpress bench --batch 1`: (tok/s, MBU, the bandwidth it measured)."""
    out = work / "bench.json"
    run([*LLMPRESS, "bench", str(artifact), "--batch", "1", "--prompt-len", "32",
         "--output-len", "128", "--json", str(out)])  # fmt: skip
    record = json.loads(out.read_text())
    row = record["results"][0]
    return row["tokens_per_s"], row["mbu"], record["bandwidth_bytes_per_s"]


def bench_rounds(artifacts: dict[str, Path], work: Path, rounds: int, log) -> dict[str, dict]:
    """`rounds` rounds, each benching every family once (alternate rounds in reverse
    order), and per family the run with the median tok/s: a neighbour's burst then slows
    one run of many families, not every run of one (a second's decoding moves by 10-20%
    on a shared machine, and a burst once put one family's three runs at 7-47 tok/s)."""
    runs: dict[str, list] = {name: [] for name in artifacts}
    for r in range(rounds):
        order = list(artifacts) if r % 2 == 0 else list(artifacts)[::-1]
        for name in order:
            runs[name].append(bench_cli(artifacts[name], work))
        log(f"bench round {r + 1}: " + ", ".join(f"{n} {runs[n][-1][0]:.1f}" for n in order))
    ceiling = max(bandwidth for rs in runs.values() for _, _, bandwidth in rs)
    out = {}
    for name, rs in runs.items():
        tok_s, mbu, bandwidth = sorted(rs)[len(rs) // 2]
        out[name] = {"tok_s": tok_s, "mbu": mbu * bandwidth / ceiling, "bandwidth": ceiling,
                     "mbu_own_ceiling": mbu, "own_bandwidth": bandwidth,
                     "runs_tok_s": [round(x[0], 1) for x in rs]}  # fmt: skip
    return out


def logits_check(artifact: Path) -> dict:
    """The runtime's exact logits against transformers' forward on the same fp32 weights
    (the artifact decoded to a dense transformers model), and plain from_pretrained of the
    artifact beside them: for a quantized MoE transformers keeps the fused experts in the
    scales' dtype (bf16) even when asked for float32, so its logits carry that rounding."""
    from transformers import AutoModelForCausalLM

    from compress.artifact.dense import load_model
    from compress.model.loading import resolve
    from compress.runtime.lm import RuntimeLM
    from compress.runtime.weights import load_weights

    ids = torch.randint(0, 49152, (1, 72), generator=torch.Generator().manual_seed(0))
    ckpt = resolve(str(artifact))
    with torch.no_grad():
        plain = AutoModelForCausalLM.from_pretrained(artifact, dtype=torch.float32)
        loaded = plain.eval()(ids).logits[0]
        del plain
        want = load_model(ckpt).eval()(ids).logits[0]
    got = RuntimeLM(load_weights(ckpt, device="cpu"), 72, exact=True)(ids).logits[0]
    return {"from_pretrained": True, "max_logit_diff": (got - want).abs().max().item(),
            "from_pretrained_diff": (got - loaded).abs().max().item(),
            "logit_std": want.std().item()}  # fmt: skip


def family_row(name: str, work: Path, log) -> tuple[dict, Path]:
    """The row's checks, and its artifact (benched later, in rounds with the others)."""
    src, art = work / f"{name}-src", work / f"{name}-w4g64"
    write_model(src, name)
    row = {"family": name, "compress_s": round(compress_cli(src, art), 1)}
    manifest = json.loads((art / "manifest.json").read_text())
    row["vllm"] = manifest["engines"].get("vllm", ["?"])
    row.update(logits_check(art))
    row["params"] = manifest.get("weights", {}).get("parameters")
    log(f"{name}: {row}")
    shutil.rmtree(src)
    return row, art


def tiny_quality(work: Path) -> dict:
    """KL to the original of rtn, awq, gptq on each tiny family model (wikitext calib)."""
    from family_models import write_family

    from compress.pipeline import compress
    from compress.recipe import parse_quant, parse_recipe

    data = ROOT.parent / "shared" / "data" / "wikitext-2-raw" / "valid.txt"
    calib = {"source": str(data), "samples": 8, "length": 64}
    ids = torch.randint(0, 49152, (1, 72), generator=torch.Generator().manual_seed(0))
    out = {}
    for name in {**FAMILIES, **HYBRID_FAMILIES}:
        src = write_family(work / f"tiny-{name}", name, tokenizer_from=convert_gguf(default_gguf()))
        base = _log_probs(src, ids)
        out[name] = {}
        for method in ("rtn", "awq", "gptq"):
            dst = work / f"tiny-{name}-{method}"
            recipe = parse_recipe({"stages": [parse_quant(f"{method}:w4g32")], "calib": calib})
            compress(str(src), recipe, dst, log=lambda _: None)
            got = _log_probs(dst, ids)
            out[name][method] = round((base.exp() * (base - got)).sum(-1).mean().item(), 5)
    return out


def _log_probs(path: Path, ids) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        return torch.log_softmax(model.eval()(ids).logits[0], -1)


# llama.cpp's converter, run as it is except for one label: it names the tokenizer's
# pre-tokenizer by a hash of known vocabularies, and the default model's tokenizer (here
# beside random qwen2-shaped weights) is not among them. The label only steers llama.cpp's
# own tokenization, which a decode-speed run does not use.
CONVERT = """
import sys
sys.path.insert(0, sys.argv.pop(1))
import conversion.base
conversion.base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
import convert_hf_to_gguf
convert_hf_to_gguf.main()
"""


def llama_cpp_gguf(bin_dir: Path, src: Path, work: Path, convert: str = CONVERT) -> Path:
    """src converted with llama.cpp's own converter (f16; `convert`: the script that runs
    it), then requantized to Q4_0."""
    converter = bin_dir.parent.parent / "src"
    f16, q4 = work / "qwen2-f16.gguf", work / "qwen2-q4_0.gguf"
    run([sys.executable, "-c", convert, str(converter), str(src), "--outtype", "f16",
         "--outfile", str(f16)])  # fmt: skip
    run([str(bin_dir / "llama-quantize"), str(f16), str(q4), "Q4_0"])
    f16.unlink()
    return q4


def llama_bench(bin_dir: Path, gguf: Path, depth: int = 0) -> float:
    """Decode tokens/s of 64 tokens after `depth` tokens in the cache (-d)."""
    r = run([str(bin_dir / "llama-bench"), "-m", str(gguf), "-t", "2", "-p", "0", "-n", "64",
             "-d", str(depth), "-r", "1", "-o", "json"], timeout=900)  # fmt: skip
    return json.loads(r.stdout)[0]["avg_ts"]


def anchors(work: Path, bin_dir: Path | None, rounds: int, log) -> dict:
    """qwen2 with biases vs the same shape without (llama), and vs llama.cpp Q4_0."""
    from transformers import LlamaConfig

    qwen_src = write_model(work / "qwen2-src", "qwen2")
    plain = LlamaConfig(**{**QWEN05, "tie_word_embeddings": False, "rope_theta": 1e6})
    llama_src = write_model(work / "nobias-src", "llama3", config=plain)
    arts = {
        "qwen2 (biases)": work / "a-qwen2",
        "same shape, no biases": work / "a-nobias",
        "qwen2 --lm-head none": work / "a-qwen2-none",
    }
    compress_cli(qwen_src, arts["qwen2 (biases)"])
    compress_cli(llama_src, arts["same shape, no biases"])
    compress_cli(qwen_src, arts["qwen2 --lm-head none"], "--lm-head", "none")
    gguf = llama_cpp_gguf(bin_dir, qwen_src, work) if bin_dir else None
    runs: dict[str, list[float]] = {k: [] for k in arts}
    if gguf:
        runs["llama.cpp Q4_0"] = []
    for r in range(rounds):
        for label, art in arts.items():
            runs[label].append(bench_cli(art, work)[0])
        if gguf:
            runs["llama.cpp Q4_0"].append(llama_bench(bin_dir, gguf))
        log(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in runs.items()))
    med = {k: statistics.median(v) for k, v in runs.items()}
    ratios = {"qwen2 with biases / without": med["qwen2 (biases)"] / med["same shape, no biases"]}
    if gguf:
        version = subprocess.run(
            [str(bin_dir / "llama-bench"), "--version"], capture_output=True, text=True
        )
        ratios["llmpress rtn:w4g64 / llama.cpp Q4_0"] = (
            med["qwen2 (biases)"] / med["llama.cpp Q4_0"]
        )
        ratios["llmpress rtn:w4g64 --lm-head none / llama.cpp Q4_0"] = (
            med["qwen2 --lm-head none"] / med["llama.cpp Q4_0"]
        )
    return {
        "runs": runs,
        "medians": med,
        "ratios": ratios,
        "llama_cpp": None if not gguf else " ".join((version.stdout + version.stderr).split()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-cpp", type=Path, help="folder with llama-bench and llama-quantize")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--families", default=",".join([*DENSE, *MOE_SETTINGS]))
    ap.add_argument("--skip-anchors", action="store_true")
    ap.add_argument(
        "--resume", action="store_true", help="keep the rows already in the results file"
    )
    add_cflags_argument(ap)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--name", default="families", help="the results' file name")
    args = ap.parse_args()
    started = time.time()
    command = "python benchmarks/families.py" + (" --llama-cpp BIN" if args.llama_cpp else "")
    if args.families != ap.get_default("families"):
        command += f" --families {args.families}"
    record = {
        "command": command + (f" --name {args.name}" if args.name != "families" else ""),
        "cpu": cpu_flags(),
        "llama_cflags": args.llama_cflags if args.llama_cpp else None,
        "rows": [],
        "tiny_kl": {},
        "anchors": None,
    }

    previous = args.out / f"{args.name}.json"
    if args.resume and previous.is_file():
        kept = json.loads(previous.read_text())
        record["rows"], record["tiny_kl"] = kept["rows"], kept.get("tiny_kl") or {}

    def save() -> None:  # after every part: a late failure keeps what was measured
        record["minutes"] = round((time.time() - started) / 60, 1)
        record["table"] = markdown(record)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{args.name}.json").write_text(json.dumps(record, indent=2) + "\n")
        (args.out / f"{args.name}.md").write_text(markdown(record))

    (HERE / "work").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=HERE / "work") as tmp:
        work = Path(tmp)
        done = {row["family"] for row in record["rows"] if "tok_s" in row}
        record["rows"] = [row for row in record["rows"] if "tok_s" in row]
        artifacts = {}
        for name in args.families.split(","):
            if name not in done:
                row, artifacts[name] = family_row(name, work, print)
                record["rows"].append(row)
                save()
        speeds = bench_rounds(artifacts, work, args.rounds, print)
        for row in record["rows"]:
            row.update(speeds.get(row["family"], {}))
        save()
        if not record["tiny_kl"]:
            record["tiny_kl"] = tiny_quality(work)
            save()
        if not args.skip_anchors:
            record["anchors"] = anchors(work, args.llama_cpp, args.rounds, print)
            save()
    print(markdown(record))


def markdown(record: dict) -> str:
    lines = [
        "| family | compresses (tiny KL: rtn / awq / gptq) | runtime vs transformers, "
        "max logit diff | from_pretrained (its max logit diff) | vLLM rules | "
        "bench batch 1 tok/s (MBU) |",
        "|---|---|---|---|---|---|",
    ]
    for row in record["rows"]:
        kl = record["tiny_kl"].get(row["family"], {})
        kls = " / ".join(f"{kl[m]:.4f}" for m in ("rtn", "awq", "gptq") if m in kl)
        vllm = "✔" if not row["vllm"] else "✘ " + "; ".join(row["vllm"])[:80]
        speed = f"{row['tok_s']:.1f} ({100 * row['mbu']:.0f}%)" if "tok_s" in row else "–"
        lines.append(
            f"| {row['family']} | ✔ ({kls}) | {row['max_logit_diff']:.1e} "
            f"| ✔ ({row.get('from_pretrained_diff', float('nan')):.1e}) | {vllm} "
            f"| {speed} |"
        )
    a = record.get("anchors")
    if a:
        lines += ["", "| measurement (median of rounds) | tok/s | runs |", "|---|---|---|"]
        for k, v in a["medians"].items():
            lines.append(f"| {k} | {v:.1f} | {', '.join(f'{x:.1f}' for x in a['runs'][k])} |")
        lines += ["", "| ratio | value |", "|---|---|"]
        lines += [f"| {k} | {v:.2f} |" for k, v in a["ratios"].items()]
        if a.get("llama_cpp"):
            lines += ["", f"llama.cpp: {a['llama_cpp']}"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
