"""Configs of GGUF files whose architecture transformers' GGUF reader has no entry for.

llama.cpp writes granite, olmo2 (and Olmo 3, under the same name), smollm3, exaone (EXAONE
3.0 and 3.5, read as llama), exaone4, exaone-moe (K-EXAONE), glm4, ernie4_5, chatglm
(GLM-4-9B-chat's, read as glm), olmoe, glm4moe, ernie4_5-moe, minimax-m2, dots1, seed_oss,
mistral3, hunyuan-dense, hunyuan-moe, command-r, cohere2, arcee, apertus, gemma, nemotron,
phi2, stablelm, qwen2vl, qwen3vl, qwen3vlmoe, gptneox, deepseek2, qwen35, qwen35moe
(Qwen3.5) and qwen3next files that
transformers cannot read (or, for nemotron and stablelm, reads with its config class's
defaults in place of the file's epsilon and rotated width). Their configs are built here
from the header keys llama.cpp's converter writes. A key that is absent takes llama.cpp
loader's default, not the transformers config class's, since it is llama.cpp's meaning the
file was written for (a granite file with no attention scale means 1/sqrt(head_dim) there,
where GraniteConfig's default is 1.0). Rope scaling, which both readers leave to
gguf_rope.py, is added by the caller.
"""

from __future__ import annotations

from compress.errors import LlmpressError

# GGUF architecture -> how its config is built (the family follows from the keys for
# olmo2: a sliding window makes it Olmo 3)
OWN_GGUF_ARCHS = (
    "granite", "olmo2", "smollm3", "exaone", "exaone4", "exaone-moe", "glm4", "ernie4_5",
    "chatglm", "olmoe", "glm4moe", "ernie4_5-moe", "minimax-m2", "dots1", "seed_oss",
    "mistral3", "hunyuan-dense", "hunyuan-moe", "command-r", "cohere2", "arcee", "apertus",
    "gemma", "nemotron", "phi2", "stablelm", "qwen2vl", "qwen3vl", "qwen3vlmoe", "gptneox",
    "deepseek2", "qwen35", "qwen35moe", "qwen3next", "granitehybrid", "lfm2",
)  # fmt: skip
# architectures whose dense MLP width may be absent: every layer has experts (llama.cpp's
# converter writes feed_forward_length only where the config has an intermediate_size)
_EXPERTS_ONLY = ("qwen35moe",)

# llama.cpp's exaone4 loader gives the 64-layer (32B) model a 4,096-token window on three
# layers of four when the file states none; other depths get no window
_EXAONE4_WINDOWED_DEPTH, _EXAONE4_WINDOW = 64, 4096


def own_gguf_config(reader, arch: str, path_name: str):
    """The transformers config of a GGUF file of `arch` (one of OWN_GGUF_ARCHS)."""
    from transformers import AutoConfig

    def get(key: str, default=None):
        field = reader.fields.get(f"{arch}.{key}")
        if field is None:
            return default
        value = field.contents()
        if key == "attention.head_count_kv" and isinstance(value, list):
            if arch not in ("granitehybrid", "lfm2") and len(set(value)) > 1:  # (0: recurrent)
                raise LlmpressError(
                    f"{path_name} gives {arch}.{key} per layer, differing, which llmpress does "
                    "not read for this family; compress the model's Hugging Face checkpoint"
                )
            return max(value)  # (Granite 4.0's, its attention layers' count everywhere)
        if isinstance(value, list) and key not in ("attention.sliding_window_pattern",):
            raise LlmpressError(
                f"{path_name} gives {arch}.{key} per layer, which llmpress does not read "
                "for this family; compress the model's Hugging Face checkpoint instead"
            )
        return value

    fields = _common(reader, get)
    if fields["intermediate_size"] is None:
        if arch not in _EXPERTS_ONLY:
            raise LlmpressError(
                f"{path_name} states no {arch}.feed_forward_length: the file is damaged or "
                "of another model; re-download it"
            )
        del fields["intermediate_size"]
    model_type, extra = _FAMILY[arch](get, fields, reader)  # a LayerNorm family drops the key
    if "rms_norm_eps" in fields:
        if fields["rms_norm_eps"] is None:  # llama.cpp's loaders require it
            raise LlmpressError(
                f"{path_name} states no {arch}.attention.layer_norm_rms_epsilon: the file is "
                "damaged or of another model; re-download it"
            )
        fields["rms_norm_eps"] = float(fields["rms_norm_eps"])
    return AutoConfig.for_model(model_type, **fields, **extra)


def _tensor_names(reader) -> set[str]:
    return {t.name for t in reader.tensors}


def _token_id(reader, key: str):
    field = reader.fields.get(f"tokenizer.ggml.{key}")
    return None if field is None else int(field.contents())


def _common(reader, get) -> dict:
    heads = int(get("attention.head_count"))
    hidden = int(get("embedding_length"))
    embed = next(t for t in reader.tensors if t.name == "token_embd.weight")
    return {
        "vocab_size": int(embed.shape[1]),  # ggml order: [hidden, vocab]
        "hidden_size": hidden,
        "intermediate_size": _int_or_none(get("feed_forward_length")),
        "num_hidden_layers": int(get("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(get("attention.head_count_kv", heads)),
        "head_dim": int(get("attention.key_length", hidden // heads)),
        "max_position_embeddings": int(get("context_length")),
        "rms_norm_eps": get("attention.layer_norm_rms_epsilon"),  # LayerNorm families: none
        "tie_word_embeddings": "output.weight" not in _tensor_names(reader),
        "bos_token_id": _token_id(reader, "bos_token_id"),
        "eos_token_id": _token_id(reader, "eos_token_id"),
        "pad_token_id": _token_id(reader, "padding_token_id"),
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": float(get("rope.freq_base", 1e4)),
        },
    }


def _int_or_none(value) -> int | None:
    return None if value is None else int(value)


def _q_biased(reader) -> bool:
    """Whether the file holds q's bias, on its own or in a fused q/k/v."""
    return bool({"blk.0.attn_q.bias", "blk.0.attn_qkv.bias"} & _tensor_names(reader))


def _rotated_width(get, fields: dict) -> None:
    """Partial rotary from `rope.dimension_count` (half of each head in the GLMs)."""
    rotated = int(get("rope.dimension_count", fields["head_dim"]))
    fields["rope_parameters"]["partial_rotary_factor"] = rotated / fields["head_dim"]


def _granitehybrid(get, fields: dict, reader) -> tuple[str, dict]:
    """IBM Granite 4.0 H (and Bamba, which llama.cpp writes alike): granite's scalars,
    Mamba-2 layers where `attention.head_count_kv` is 0 (llama.cpp's loader: "a layer is
    recurrent iff its n_head_kv is 0"), their widths from the `ssm.*` keys (the heads as
    `ssm.time_step_rank`), rope only where `rope.scaling.finetuned` (absent: true; the H
    models write false), the MLP's width that of its ffn_gate. Models with experts, or
    rotating part of each head (Bamba's), are refused in one line."""
    field = reader.fields["granitehybrid.attention.head_count_kv"].contents()
    kv = field if isinstance(field, list) else [field] * fields["num_hidden_layers"]
    if int(get("expert_count", 0) or 0):
        raise LlmpressError(
            "the file's Granite 4.0 model has experts (H-Tiny, H-Small), which llmpress does "
            "not read from GGUF yet; compress the model's Hugging Face checkpoint instead"
        )
    head_dim, hidden = fields["head_dim"], fields["hidden_size"]
    if int(get("rope.dimension_count", head_dim)) != head_dim:
        raise LlmpressError(
            "the file's model rotates part of each head (Bamba's), which llmpress does not read "
            "from GGUF; compress the model's Hugging Face checkpoint instead"
        )
    heads, inner = int(get("ssm.time_step_rank")), int(get("ssm.inner_size"))
    rope = get("rope.scaling.finetuned", True)
    gate = next(t for t in reader.tensors if t.name.endswith(".ffn_gate.weight"))
    names = _tensor_names(reader)
    return "granitemoehybrid", {
        **_granite(get, fields, reader)[1],
        "layer_types": ["attention" if n else "mamba" for n in kv],
        "num_local_experts": 0,
        "shared_intermediate_size": int(gate.shape[1]),  # ggml order: [hidden, width]
        "position_embedding_type": "rope" if rope else None,
        "mamba_n_heads": heads,
        "mamba_d_head": inner // heads,
        "mamba_d_state": int(get("ssm.state_size")),
        "mamba_n_groups": int(get("ssm.group_count")),
        "mamba_d_conv": int(get("ssm.conv_kernel")),
        "mamba_expand": inner // hidden,  # (llama.cpp asserts 2 · hidden)
        "mamba_conv_bias": any(n.endswith("ssm_conv1d.bias") for n in names),
    }


def _lfm2(get, fields: dict, reader) -> tuple[str, dict]:
    """LFM2 (Liquid AI): a gated short convolution (kernel `shortconv.l_cache`) wherever
    the per-layer `attention.head_count_kv` is 0 (llama.cpp's rule), attention with per-head
    q/k norms in the others; `feed_forward_length` is the MLP's width already adjusted
    (so block_auto_adjust_ff_dim is off); the final norm is stored as token_embd_norm."""
    field = reader.fields["lfm2.attention.head_count_kv"].contents()
    kv = field if isinstance(field, list) else [field] * fields["num_hidden_layers"]
    eps = fields.pop("rms_norm_eps")
    if eps is None:
        raise LlmpressError(
            "the file states no lfm2.attention.layer_norm_rms_epsilon: it is damaged or of "
            "another model; re-download it"
        )
    return "lfm2", {
        "layer_types": ["full_attention" if n else "conv" for n in kv],
        "conv_L_cache": int(get("shortconv.l_cache", 3)),
        "block_auto_adjust_ff_dim": False,
        "norm_eps": float(eps),
        "conv_bias": False,
    }


def _granite(get, fields: dict, reader) -> tuple[str, dict]:
    """llama.cpp scales by a granite scalar only where the file states one (0 = absent)."""
    return "granite", {
        "attention_multiplier": float(get("attention.scale", 0) or fields["head_dim"] ** -0.5),
        "embedding_multiplier": float(get("embedding_scale", 0) or 1.0),
        "residual_multiplier": float(get("residual_scale", 0) or 1.0),
        "logits_scaling": float(get("logit_scale", 0) or 1.0),
        **_biases(reader),
    }


def _window_layers(get, layers: int, default_window: int | None) -> tuple[int | None, list]:
    """(window, layer_types) as llama.cpp's loader reads them: the window key, then a
    per-layer pattern (booleans: True = windowed) or a period whose last layer is full."""
    window = get("attention.sliding_window", default_window)
    if not window:
        return None, ["full_attention"] * layers
    pattern = get("attention.sliding_window_pattern", 4)
    if isinstance(pattern, list):
        windowed = [bool(p) for p in pattern]
        if len(windowed) != layers:
            raise LlmpressError(
                f"the file's sliding-window pattern has {len(windowed)} entries for {layers} "
                "layers: the file is damaged; re-download it"
            )
    else:
        period = int(pattern)
        windowed = [period == 0 or i % period < period - 1 for i in range(layers)]
    return int(window), ["sliding_attention" if w else "full_attention" for w in windowed]


def _olmo(get, fields: dict, reader) -> tuple[str, dict]:
    """olmo2; with a window it is Olmo 3 (llama.cpp writes both as olmo2), whose windowed
    layers rotate at their own base and without the full layers' scaling."""
    window, layer_types = _window_layers(get, fields["num_hidden_layers"], None)
    if window is None:
        return "olmo2", {}
    theta = fields["rope_parameters"]["rope_theta"]
    swa_theta = float(get("rope.freq_base_swa", theta))
    fields["rope_parameters"] = {
        "sliding_attention": {"rope_type": "default", "rope_theta": swa_theta},
        "full_attention": {"rope_type": "default", "rope_theta": theta},
    }
    return "olmo3", {"sliding_window": window, "layer_types": layer_types}


def _smollm3(get, fields: dict, reader) -> tuple[str, dict]:
    """llama.cpp fixes SmolLM3's layers without rope at every fourth; no key states it."""
    return "smollm3", {"no_rope_layer_interval": 4, "use_sliding_window": False}


def _exaone4(get, fields: dict, reader) -> tuple[str, dict]:
    """With a window, the full layers have no rope (the config class's rule too). A
    window the file states is taken at any depth: the checkpoint it was converted from
    had it (llama.cpp's loader windows only the 64-layer model)."""
    layers = fields["num_hidden_layers"]
    default = _EXAONE4_WINDOW if layers == _EXAONE4_WINDOWED_DEPTH else None
    window, layer_types = _window_layers(get, layers, default)
    return "exaone4", {"sliding_window": window, "layer_types": layer_types}


def _exaone(get, fields: dict, reader) -> tuple[str, dict]:
    """EXAONE 3.0 and 3.5, llama's model (transformers runs them as llama): llama's keys,
    q/k in the checkpoint's layout (the converter is not LlamaModel's and permutes
    nothing), llama3 scaling as a rope_freqs tensor. Its RMS epsilon is
    `layer_norm_rms_epsilon` from the converters LG's files were made with, and
    `layer_norm_epsilon` from later ones (the checkpoint's key, written as it is named)."""
    if fields["rms_norm_eps"] is None:
        fields["rms_norm_eps"] = get("attention.layer_norm_epsilon")
    rotated = int(get("rope.dimension_count", fields["head_dim"]))
    if rotated != fields["head_dim"]:
        raise LlmpressError(
            f"the file rotates {rotated} of each head's {fields['head_dim']} dimensions, "
            "which no EXAONE 3 does: compress the model's Hugging Face checkpoint instead"
        )
    return "llama", _biases(reader)


def _exaone_moe(get, fields: dict, reader) -> tuple[str, dict]:
    """K-EXAONE: exaone4's window keys (with a window, the full layers have no rope) in
    llama's pre-norm block, DeepSeek-V3's expert keys, shared experts as wide as that many
    experts (a file that says otherwise is refused). The block count includes the
    next-token-prediction blocks, which are not converted; its converter states no rope
    scaling."""
    fields["num_hidden_layers"] -= int(get("nextn_predict_layers", 0) or 0)
    layers = fields["num_hidden_layers"]
    window, layer_types = _window_layers(get, layers, None)
    v3 = _deepseek_v3_experts(get, "exaone-moe")
    width, count = v3["moe_intermediate_size"], v3["n_shared_experts"]
    shared = int(get("expert_shared_feed_forward_length", 0) or width * count)
    if shared != width * count:
        raise LlmpressError(
            f"the file's shared experts are {shared} wide, not {count} × {width}, which "
            "this family computes: compress the model's Hugging Face checkpoint instead"
        )
    dense = v3["first_k_dense_replace"]
    return "exaone_moe", {
        "num_experts": v3["n_routed_experts"],
        "num_experts_per_tok": v3["num_experts_per_tok"],
        "moe_intermediate_size": width,
        "num_shared_experts": count,
        "routed_scaling_factor": v3["routed_scaling_factor"],
        "norm_topk_prob": v3["norm_topk_prob"],
        "n_group": v3["n_group"],
        "topk_group": v3["topk_group"],
        "mlp_layer_types": ["dense" if i < dense else "sparse" for i in range(layers)],
        "sliding_window": window,
        "layer_types": layer_types,
    }


def _glm4(get, fields: dict, reader) -> tuple[str, dict]:
    """The file keeps transformers' q/k rows (llama.cpp rotates consecutive pairs, as
    glm4 does)."""
    _rotated_width(get, fields)
    return "glm4", {"attention_bias": _q_biased(reader)}


def _chatglm(get, fields: dict, reader) -> tuple[str, dict]:
    """GLM-4-9B-chat (and the HF port's glm): glm's block. The converter writes q/k/v as
    one attn_qkv from the original checkpoint, as three from the HF port (gguf_tensors
    reads either)."""
    _rotated_width(get, fields)
    return "glm", {"attention_bias": _q_biased(reader)}


def _ernie4_5(get, fields: dict, reader) -> tuple[str, dict]:
    """use_bias gives every linear a bias; the file says so by holding them."""
    return "ernie4_5", {"use_bias": _q_biased(reader)}


def _seed_oss(get, fields: dict, reader) -> tuple[str, dict]:
    """Its three bias keys, each said by the tensors the file holds."""
    names = _tensor_names(reader)
    return "seed_oss", {
        "attention_bias": _q_biased(reader),
        "attention_out_bias": "blk.0.attn_output.bias" in names,
        "mlp_bias": "blk.0.ffn_up.bias" in names,
    }


def _mistral3(get, fields: dict, reader) -> tuple[str, dict]:
    """llama.cpp's mistral3: Ministral 3, and the language model of Mistral Small 3.1/3.2
    (llama's block either way). Ministral 3's file sets `attention.temperature_scale`, Llama
    4's query temperature, which steps at YaRN's original context (llama.cpp's
    n_ctx_orig_yarn; transformers' rope_parameters), so it needs that context too."""
    beta = get("attention.temperature_scale")
    if not beta:
        return "mistral", {}
    if get("rope.scaling.original_context_length") is None:
        raise LlmpressError(
            "this mistral3 GGUF sets a query temperature (attention.temperature_scale) but no "
            "original context for it (rope.scaling.original_context_length); compress the "
            "model's Hugging Face checkpoint instead"
        )
    fields["rope_parameters"]["llama_4_scaling_beta"] = float(beta)
    return "ministral3", {}


def _hunyuan_dense(get, fields: dict, reader) -> tuple[str, dict]:
    """llama.cpp writes Hunyuan's NTK-alpha rope as the base it gives (theta * alpha^(d /
    (d - 2))), with no scaling: the default rope at that base is the same rotation. Its
    per-head q/k norms follow rope in the family; biases are said by the tensors held."""
    return "hunyuan_v1_dense", {
        "attention_bias": _q_biased(reader),
        "mlp_bias": "blk.0.ffn_up.bias" in _tensor_names(reader),
    }


def _hunyuan_moe(get, fields: dict, reader) -> tuple[str, dict]:
    """hunyuan-dense's attention and base over experts: `expert_feed_forward_length` is an
    expert's width, which the family's shared MLP shares (transformers' HunYuanMoEV1 gives
    both `intermediate_size`); a file whose shared width or count says otherwise is refused."""
    experts, used = _experts(get, "hunyuan-moe")
    width = int(get("expert_feed_forward_length") or fields["intermediate_size"])
    shared = int(get("expert_shared_feed_forward_length") or width)
    if shared != width or int(get("expert_shared_count", 1) or 1) != 1:
        raise LlmpressError(
            f"the file's shared expert ({get('expert_shared_count', 1)} of width {shared}) is "
            f"not one as wide as each expert ({width}), which this family computes: compress "
            "the model's Hugging Face checkpoint instead"
        )
    _, extra = _hunyuan_dense(get, fields, reader)
    fields["intermediate_size"] = width
    return "hunyuan_v1_moe", {**extra, "num_experts": experts, "moe_topk": used}


def _olmoe(get, fields: dict, reader) -> tuple[str, dict]:
    """feed_forward_length is each expert's width; llama.cpp's olmoe graph never
    renormalizes the chosen experts' weights (OLMoE's norm_topk_prob is false), and the
    file has no key for it."""
    experts, used = _experts(get, "olmoe")
    return "olmoe", {
        "num_experts": experts,
        "num_experts_per_tok": used,
        "norm_topk_prob": False,
        "attention_bias": _q_biased(reader),
    }


def _experts(get, arch: str, sigmoid: bool = False) -> tuple[int, int]:
    """The expert count and how many a token uses. `sigmoid`: the family routes by sigmoid
    scores, and a file whose gating key says another is refused (absent: sigmoid)."""
    experts, used = get("expert_count"), get("expert_used_count")
    if not experts or not used:
        raise LlmpressError(
            f"the file's {arch}.expert_count or expert_used_count is missing: the file is "
            "damaged; re-download it"
        )
    if sigmoid and int(get("expert_gating_func", 2) or 2) != 2:
        raise LlmpressError(
            f"the file's {arch}.expert_gating_func is not sigmoid, which this family routes "
            "by: compress the model's Hugging Face checkpoint instead"
        )
    return int(experts), int(used)


def _glm4moe(get, fields: dict, reader) -> tuple[str, dict]:
    """GLM-4.5: the block count includes the next-token-prediction blocks, which are not
    converted (the converted checkpoint holds the model's own)."""
    fields["num_hidden_layers"] -= int(get("nextn_predict_layers", 0) or 0)
    _rotated_width(get, fields)
    return "glm4_moe", {
        **_deepseek_v3_experts(get, "glm4moe"),
        "use_qk_norm": "blk.0.attn_q_norm.weight" in _tensor_names(reader),
        "attention_bias": _q_biased(reader),
        "num_nextn_predict_layers": 0,
    }


def _dots1(get, fields: dict, reader) -> tuple[str, dict]:
    """dots.llm1: glm4moe's expert keys under qwen3's attention, every layer full (llama.cpp
    runs no window for it)."""
    return "dots1", {
        **_deepseek_v3_experts(get, "dots1"),
        "attention_bias": _q_biased(reader),
        "sliding_window": None,
    }


def _deepseek_v3_experts(get, arch: str, sigmoid: bool = True) -> dict:
    """The config of DeepSeek-V3's experts as glm4moe and dots1 files state them;
    llama.cpp's defaults for absent keys: no dense layers, no scale, no renormalizing,
    sigmoid scores (the only gating its graphs run for these families). Without `sigmoid`,
    the keys DeepSeek-V2's softmax-gated experts are stated by alike."""
    experts, used = _experts(get, arch, sigmoid=sigmoid)
    return {
        "n_routed_experts": experts,
        "num_experts_per_tok": used,
        "moe_intermediate_size": int(get("expert_feed_forward_length")),
        "n_shared_experts": int(get("expert_shared_count", 0) or 0),
        "first_k_dense_replace": int(get("leading_dense_block_count", 0) or 0),
        "routed_scaling_factor": float(get("expert_weights_scale", 0) or 1.0),
        "norm_topk_prob": bool(get("expert_weights_norm", False)),
        "n_group": int(get("expert_group_count", 1) or 1),
        "topk_group": int(get("expert_group_used_count", 1) or 1),
    }


def _ernie4_5_moe(get, fields: dict, reader) -> tuple[str, dict]:
    """Experts from `leading_dense_block_count` on, every `interleave_moe_layer_step`-th
    layer (llama.cpp's rule), to the last."""
    experts, used = _experts(get, "ernie4_5-moe")
    return "ernie4_5_moe", {
        "moe_num_experts": experts,
        "moe_k": used,
        "moe_intermediate_size": int(get("expert_feed_forward_length")),
        "moe_num_shared_experts": int(get("expert_shared_count", 0) or 0),
        "moe_layer_start_index": int(get("leading_dense_block_count", 0) or 0),
        "moe_layer_interval": int(get("interleave_moe_layer_step", 1) or 1),
        "moe_layer_end_index": -1,
        "use_bias": _q_biased(reader),
    }


def _minimax_m2(get, fields: dict, reader) -> tuple[str, dict]:
    """The rotated width from `rope.dimension_count` (MiniMax-M2's rotary_dim); sigmoid
    scores, which the converter writes from the config's scoring_func."""
    _rotated_width(get, fields)
    experts, used = _experts(get, "minimax-m2", sigmoid=True)
    fields["intermediate_size"] = int(get("expert_feed_forward_length"))
    return "minimax_m2", {"num_local_experts": experts, "num_experts_per_tok": used}


def _cohere_keys(get, fields: dict) -> dict:
    """Cohere's LayerNorm epsilon and logit scale (llama.cpp scales by none when the file
    states none). The file keeps transformers' q/k rows: llama.cpp rotates consecutive
    pairs, as cohere does."""
    return {
        **_layer_norm_eps(get, fields, "layer_norm_eps"),
        "logit_scale": float(get("logit_scale", 0) or 1.0),
    }


def _command_r(get, fields: dict, reader) -> tuple[str, dict]:
    """Command R, Aya: per-head q/k LayerNorms where the file holds them (Command R+)."""
    names = _tensor_names(reader)
    return "cohere", {
        **_cohere_keys(get, fields),
        "use_qk_norm": "blk.0.attn_q_norm.weight" in names,
        "attention_bias": _q_biased(reader),
    }


def _cohere2(get, fields: dict, reader) -> tuple[str, dict]:
    """Command R7B, Command A: llama.cpp reads its window as required and its pattern as
    4 (3 sliding, then 1 full) unless the file states one; its converter drops the
    checkpoints' all-zero biases."""
    window, layer_types = _window_layers(get, fields["num_hidden_layers"], None)
    if window is None:
        raise LlmpressError(
            "the cohere2 file states no sliding window (llama.cpp requires one): it is "
            "damaged or of another model; re-download it"
        )
    return "cohere2", {
        **_cohere_keys(get, fields),
        "sliding_window": window,
        "layer_types": layer_types,
    }


def _arcee(get, fields: dict, reader) -> tuple[str, dict]:
    """llama's keys (its converter is LlamaModel's, q/k interleaved); an MLP without a
    gate."""
    return "arcee", _biases(reader)


def _biases(reader) -> dict:
    """llama's two bias keys, each said by the tensors the file holds."""
    names = _tensor_names(reader)
    return {"attention_bias": _q_biased(reader), "mlp_bias": "blk.0.ffn_up.bias" in names}


def _apertus(get, fields: dict, reader) -> tuple[str, dict]:
    """llama's keys, q/k in transformers' layout (its converter undoes no permutation) and
    per-head q/k norms; each layer's xIELU parameters are header arrays, which
    gguf_tensors writes back as the checkpoint's act_fn tensors."""
    return "apertus", _biases(reader)


def _qwen2vl(get, fields: dict, reader) -> tuple[str, dict]:
    """The language model of Qwen2-VL and Qwen2.5-VL, as llama.cpp's converter writes it
    beside the vision tower's mmproj file: qwen2's keys and tensors. M-RoPE's
    `rope.dimension_sections` give each section of the rotary frequencies a time, height
    or width position, which for text alone are the token's position thrice: qwen2's
    default rope (model/text_part.py)."""
    return "qwen2", {}


def _qwen3vl(get, fields: dict, reader) -> tuple[str, dict]:
    """Qwen3-VL's language model: qwen3's keys and tensors, M-RoPE as qwen2vl's."""
    return "qwen3", {"attention_bias": _q_biased(reader)}


def _qwen3vlmoe(get, fields: dict, reader) -> tuple[str, dict]:
    """Qwen3-VL-30B-A3B's and 235B-A22B's language model: qwen3moe's keys and tensors (each
    expert `expert_feed_forward_length` wide, experts in every layer), M-RoPE as qwen2vl's;
    its router always renormalizes the chosen experts' weights (the file has no key for it;
    llama.cpp's graph does so too)."""
    experts, used = _experts(get, "qwen3vlmoe")
    return "qwen3_moe", {
        "num_experts": experts,
        "num_experts_per_tok": used,
        "moe_intermediate_size": int(get("expert_feed_forward_length", 0) or 0)
        or fields["intermediate_size"],
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "use_sliding_window": False,
        "attention_bias": _q_biased(reader),
    }


def _layer_norm_eps(get, fields: dict, key: str) -> dict:
    """A LayerNorm family's epsilon under its config key (the file's layer_norm_epsilon)."""
    fields.pop("rms_norm_eps")
    eps = get("attention.layer_norm_epsilon")
    if eps is None:  # llama.cpp's loaders require it
        raise LlmpressError(
            "the file states no attention.layer_norm_epsilon: it is damaged or of another "
            "model; re-download it"
        )
    return {key: float(eps)}


def _gemma(get, fields: dict, reader) -> tuple[str, dict]:
    """Gemma 1, CodeGemma: llama.cpp's converter stores the norms as 1 + w (gguf_tensors
    undoes it) and writes no rope base (10,000, the default)."""
    return "gemma", {"hidden_activation": "gelu_pytorch_tanh"}


def _nemotron(get, fields: dict, reader) -> tuple[str, dict]:
    """Minitron, Nemotron-Mini: LayerNorm1P's weights stored as 1 + w, as gemma's; half
    of each head rotated unless `rope.dimension_count` says otherwise."""
    _rotated_width(get, fields)
    return "nemotron", {**_layer_norm_eps(get, fields, "norm_eps"), **_biases(reader)}


def _phi2(get, fields: dict, reader) -> tuple[str, dict]:
    """Phi-1, Phi-1.5, Phi-2: a parallel block under one LayerNorm, q/k/v (one attn_qkv in
    files of the original checkpoints) and the head with biases."""
    _rotated_width(get, fields)
    return "phi", _layer_norm_eps(get, fields, "layer_norm_eps")


def _stablelm(get, fields: dict, reader) -> tuple[str, dict]:
    """StableLM 2, StableLM-3B: llama.cpp's graph runs the block parallel where the file
    holds no ffn_norm, as transformers does with use_parallel_residual; per-head q/k
    LayerNorms (StableLM 2 12B) are in the config for adapter_for to refuse."""
    _rotated_width(get, fields)
    names = _tensor_names(reader)
    return "stablelm", {
        **_layer_norm_eps(get, fields, "layer_norm_eps"),
        "use_qkv_bias": _q_biased(reader),
        "use_parallel_residual": "blk.0.ffn_norm.weight" not in names,
        "qk_layernorm": "blk.0.attn_q_norm.weight" in names,
    }


def _gptneox(get, fields: dict, reader) -> tuple[str, dict]:
    """Pythia, GPT-NeoX-20B: each branch under a LayerNorm of its own, in parallel where
    `use_parallel_residual` says (llama.cpp's default too); q/k/v fused, which the
    converter wrote as q, then k, then v rows (gguf_tensors puts them back head by head);
    no rope base written (10,000, the default)."""
    _rotated_width(get, fields)
    return "gpt_neox", {
        **_layer_norm_eps(get, fields, "layer_norm_eps"),
        "use_parallel_residual": bool(get("use_parallel_residual", True)),
        "attention_bias": _q_biased(reader),
    }


def _deepseek2(get, fields: dict, reader) -> tuple[str, dict]:
    """DeepSeek-V2 and V3 (and their kin) as llama.cpp writes both: multi-head latent
    attention, stated as one KV head of the latent's width (`head_count_kv` 1, `key_length`
    the latent and rope) beside the real widths (`key_length_mla`, `value_length_mla`,
    `kv_lora_rank`, `q_lora_rank` where q has its pair); V3 where the experts are gated by
    sigmoids (or steered by `exp_probs_b`), V2 otherwise (softmax, within groups where the
    file states more than one)."""
    heads, rope = fields["num_attention_heads"], int(get("rope.dimension_count"))
    key, value = get("attention.key_length_mla"), get("attention.value_length_mla")
    if key is None or value is None or get("attention.kv_lora_rank") is None:
        raise LlmpressError(
            "the file states no attention.key_length_mla, value_length_mla or kv_lora_rank: "
            "it is of an older converter; convert the model's Hugging Face checkpoint again"
        )
    q_rank = get("attention.q_lora_rank")
    fields.update(num_key_value_heads=heads, head_dim=rope)
    attention = {
        "kv_lora_rank": int(get("attention.kv_lora_rank")),
        "q_lora_rank": int(q_rank) if q_rank else None,
        "qk_rope_head_dim": rope,
        "qk_nope_head_dim": int(key) - rope,
        "v_head_dim": int(value),
    }
    names = _tensor_names(reader)
    sigmoid = int(get("expert_gating_func", 1) or 1) == 2 or "blk.1.exp_probs_b.bias" in names
    if sigmoid:
        fields["num_hidden_layers"] -= int(get("nextn_predict_layers", 0) or 0)
        return "deepseek_v3", {
            **attention, **_deepseek_v3_experts(get, "deepseek2"), "num_mtp_layers": 0,
        }  # fmt: skip
    experts = _deepseek_v3_experts(get, "deepseek2", sigmoid=False)
    experts.pop("norm_topk_prob")  # V2's router never renormalizes
    grouped = experts["n_group"] > 1
    return "deepseek_v2", {
        **attention,
        **experts,
        "topk_method": "group_limited_greedy" if grouped else "greedy",
    }


def _deltanet(get, fields: dict, arch: str) -> dict:
    """Qwen3.5's and Qwen3-Next's layer kinds and DeltaNet widths, as llama.cpp's
    Qwen3NextModel writes them: the key heads as `ssm.group_count`, the value heads as
    `ssm.time_step_rank`, a key head's width as `ssm.state_size`, all value heads' as
    `ssm.inner_size`; every `full_attention_interval`-th layer full attention (4 when
    absent, its converter's default), the others DeltaNets. Newer converters append
    Qwen3.5's prediction blocks (`nextn_predict_layers`), which the block count includes
    and the converted checkpoint leaves out, as the model's own checkpoint's loader does."""
    fields["num_hidden_layers"] -= int(get("nextn_predict_layers", 0) or 0)
    keys = ("ssm.conv_kernel", "ssm.state_size", "ssm.group_count", "ssm.time_step_rank",
            "ssm.inner_size")  # fmt: skip
    missing = [k for k in keys if get(k) is None]
    if missing:
        raise LlmpressError(
            f"the file states no {arch}.{missing[0]} (a Gated DeltaNet's width): it is "
            "damaged or of another model; re-download it"
        )
    v_heads = int(get("ssm.time_step_rank"))
    interval = int(get("full_attention_interval", 4) or 4)
    layers = fields["num_hidden_layers"]
    _rotated_width(get, fields)
    return {
        "linear_conv_kernel_dim": int(get("ssm.conv_kernel")),
        "linear_key_head_dim": int(get("ssm.state_size")),
        "linear_num_key_heads": int(get("ssm.group_count")),
        "linear_num_value_heads": v_heads,
        "linear_value_head_dim": int(get("ssm.inner_size")) // v_heads,
        "layer_types": [
            "full_attention" if (i + 1) % interval == 0 else "linear_attention"
            for i in range(layers)
        ],
    }


def _qwen35(get, fields: dict, reader) -> tuple[str, dict]:
    """Qwen3.5's language model (`Qwen3_5ForCausalLM`): M-RoPE's sections (one position
    for text) on `rope.dimension_count` of each head, as qwen3vl's."""
    return "qwen3_5_text", _deltanet(get, fields, "qwen35")


def _qwen35moe(get, fields: dict, reader) -> tuple[str, dict]:
    """Qwen3.5's MoE language model: experts in every layer, always renormalized, and a
    gated shared expert (`ffn_gate_inp_shexp`)."""
    return "qwen3_5_moe_text", {
        **_deltanet(get, fields, "qwen35moe"),
        **_shared_gated_experts(get, "qwen35moe"),
    }


def _shared_gated_experts(get, arch: str) -> dict:
    """qwen2moe's experts beside a gated shared expert, as Qwen3.5's and Qwen3-Next's
    files state them."""
    experts, used = _experts(get, arch)
    return {
        "num_experts": experts,
        "num_experts_per_tok": used,
        "moe_intermediate_size": int(get("expert_feed_forward_length")),
        "shared_expert_intermediate_size": int(get("expert_shared_feed_forward_length")),
    }


def _qwen3next(get, fields: dict, reader) -> tuple[str, dict]:
    """Qwen3-Next: Qwen3.5's layers with experts in every layer (llama.cpp's graph runs no
    dense layer and renormalizes the chosen experts' weights)."""
    return "qwen3_next", {
        **_deltanet(get, fields, "qwen3next"),
        **_shared_gated_experts(get, "qwen3next"),
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
    }


_FAMILY = {
    "granite": _granite,
    "olmo2": _olmo,
    "smollm3": _smollm3,
    "exaone": _exaone,
    "exaone4": _exaone4,
    "exaone-moe": _exaone_moe,
    "glm4": _glm4,
    "ernie4_5": _ernie4_5,
    "chatglm": _chatglm,
    "olmoe": _olmoe,
    "glm4moe": _glm4moe,
    "ernie4_5-moe": _ernie4_5_moe,
    "minimax-m2": _minimax_m2,
    "dots1": _dots1,
    "seed_oss": _seed_oss,
    "mistral3": _mistral3,
    "hunyuan-dense": _hunyuan_dense,
    "hunyuan-moe": _hunyuan_moe,
    "command-r": _command_r,
    "cohere2": _cohere2,
    "arcee": _arcee,
    "apertus": _apertus,
    "gemma": _gemma,
    "nemotron": _nemotron,
    "phi2": _phi2,
    "stablelm": _stablelm,
    "qwen2vl": _qwen2vl,
    "qwen3vl": _qwen3vl,
    "qwen3vlmoe": _qwen3vlmoe,
    "gptneox": _gptneox,
    "deepseek2": _deepseek2,
    "qwen35": _qwen35,
    "qwen35moe": _qwen35moe,
    "qwen3next": _qwen3next,
    "granitehybrid": _granitehybrid,
    "lfm2": _lfm2,
}


def gguf_tokenizer(path):
    """The tokenizer a GGUF file of one of OWN_GGUF_ARCHS describes, built from its
    tokenizer keys alone (AutoTokenizer reads the file's config first, which fails on
    these architectures). A pre-tokenizer name transformers has no split for but llama.cpp
    treats as another's is given that one's (glm4: llama 3's); left unsplit, numbers and
    spaces would be cut as GPT-2 cuts them, not as the model was trained."""
    from gguf import GGUFReader
    from tokenizers import Regex, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf import gguf_tokenizer_mapping as known

    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(path.parent), gguf_file=path.name)
    field = GGUFReader(str(path)).fields.get("tokenizer.ggml.pre")
    pre = None if field is None else field.contents()
    alias = _PRE_TOKENIZER_ALIASES.get(pre)
    if pre in _DIGITS_THEN_GPT2 and pre not in known.GGUF_PRE_TOKENIZER_SPLITS:
        tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    elif alias is not None and pre not in known.GGUF_PRE_TOKENIZER_SPLITS:
        split = known.GGUF_PRE_TOKENIZER_SPLITS[alias]
        tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    return tokenizer


# llama.cpp's pre-tokenizer names whose split is each digit alone, then GPT-2's
# (llama-vocab.cpp's STARCODER group: Command R's, EXAONE 3's, SmolLM's), as these models'
# own tokenizers split (Digits, then ByteLevel); without it digits would be cut in runs,
# which gives the same tokens only where the vocabulary never merged two digits
_DIGITS_THEN_GPT2 = ("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva")
# llama.cpp's pre-tokenizer names -> the one whose split it uses (llama-vocab.cpp: glm4's
# and chatglm-bpe's CHATGLM4 type splits as llama 3; stablelm2's as qwen2)
_PRE_TOKENIZER_ALIASES = {
    "glm4": "llama3",
    "glm5": "llama3",
    "chatglm-bpe": "llama3",
    "stablelm2": "qwen2",
}
