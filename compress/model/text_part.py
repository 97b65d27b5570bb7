"""The text part of a multimodal checkpoint, made once into a cached text-only folder.

Gemma 3 from 4B up ships as `Gemma3ForConditionalGeneration` (model_type `gemma3`),
Mistral Small 3.1/3.2, Magistral Small and Ministral 3 as
`Mistral3ForConditionalGeneration` (`mistral3`), the LLaVA family and Pixtral as
`Llava*ForConditionalGeneration` (`llava`, `llava_next`, `llava_onevision`), Aya Vision as
`AyaVisionForConditionalGeneration` (`aya_vision`), InternVL 3 as
`InternVLForConditionalGeneration` (`internvl`), SmolVLM as `SmolVLMForConditionalGeneration`
or `Idefics3ForConditionalGeneration` (`smolvlm`, `idefics3`), Qwen2-VL, Qwen2.5-VL and
Qwen3-VL as `Qwen2VLForConditionalGeneration`, `Qwen2_5_VLForConditionalGeneration`,
`Qwen3VLForConditionalGeneration` (`Qwen3VLMoeForConditionalGeneration`), Qwen3.5 as
`Qwen3_5ForConditionalGeneration` (`qwen3_5`, its language model `qwen3_5_text`), GLM-4.1V and
GLM-4.5V as `Glm4vForConditionalGeneration`, `Glm4vMoeForConditionalGeneration`: a vision
tower and projector beside a language model (`gemma3_text`; `mistral` or `ministral3`;
llama, mistral, qwen2, ...; `cohere2`; qwen2 or qwen3; llama; qwen2; qwen3 or qwen3_moe;
glm4 or glm4_moe) whose
config sits in
`text_config` (at the top level in Qwen2-VL's and Qwen2.5-VL's published configs) and whose
tensors are prefixed `language_model.model.` (as published) or `model.language_model.` (as
some transformers versions save), `model.text_model.` (SmolVLM), or `model.` beside
`visual.` (Qwen2-VL, Qwen2.5-VL as published). The Qwen-VL and GLM-V language models rotate by
positions in three sections (M-RoPE: time, height, width of each token), which for text
alone are the token's position thrice: their text is computed as by the text family's
default rope, at the same base, and that is what the text part's config says. llmpress
compresses and runs text, so every command reads the language model alone, as the text
family names it, with the source's tokenizer: the artifact is the text family's
ForCausalLM (`Gemma3ForCausalLM`, `Qwen2ForCausalLM`, ...) that transformers and vLLM open
as such. The folder is written
file by file (memory bounded by one shard), keyed by the source's files (name, size,
mtime) so a second run reuses it, and records the source's weight hash, which eval's base
check compares.

The same writer reads a checkpoint of another family's model under names of its own
(RENAMED: EXAONE 3.x, llama's model; Sarvam-30B and Param-2, glm4_moe's under Bailing's
names with a fused query_key_value) as that family's folder, once.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from compress.errors import LlmpressError
from compress.model.adapters import ADAPTERS
from compress.model.default import conversion_target, publish_conversion

# model_type of the multimodal config -> its text part's model_type where text_config
# names none (transformers' default text config of that class)
MULTIMODAL = {
    "gemma3": "gemma3_text",
    "mistral3": "mistral",
    "llava": "llama",  # LLaVA-1.5, Pixtral-12B (mistral text)
    "llava_next": "llama",  # LLaVA-NeXT (llama, mistral or qwen2 text)
    "llava_onevision": "qwen2",  # LLaVA-OneVision
    "aya_vision": "cohere2",  # Aya Vision 8B, 32B
    "internvl": "qwen2",  # InternVL 3 (3.5: qwen3, said by its text_config)
    "smolvlm": "llama",  # SmolVLM 2
    "idefics3": "llama",  # SmolVLM, Idefics 3
    "qwen2_vl": "qwen2",
    "qwen2_5_vl": "qwen2",
    "qwen3_vl": "qwen3",
    "qwen3_vl_moe": "qwen3_moe",  # Qwen3-VL-30B-A3B, 235B-A22B
    "glm4v": "glm4",  # GLM-4.1V-9B-Thinking
    "glm4v_moe": "glm4_moe",  # GLM-4.5V
    "apertus1p5": "apertus1p5_text",  # Apertus 1.5 (image and audio code tokenizers beside)
    "qwen3_5": "qwen3_5_text",  # Qwen3.5 (0.8B-27B; its mtp.* prediction layer left out)
    "qwen3_5_moe": "qwen3_5_moe_text",  # Qwen3.5-35B-A3B, 122B-A10B, 397B-A17B
    "lfm2_vl": "lfm2",  # LFM2-VL 450M, 1.6B, 3B
}
# text_config model types that are a family's model with M-RoPE -> that family
MROPE_TEXT = {
    "qwen2_vl_text": "qwen2",
    "qwen2_5_vl_text": "qwen2",
    "qwen3_vl_text": "qwen3",
    "qwen3_vl_moe_text": "qwen3_moe",
    "glm4v_text": "glm4",
    "glm4v_moe_text": "glm4_moe",
}
# what a text family's config would read that the multimodal one's language model never
# computes: Qwen3-VL's attends to every position, whatever sliding-window keys it carries
# (Qwen3VLTextConfig has none; qwen3 would window the layers they name); Qwen3-VL-MoE's
# router always renormalizes the chosen experts' weights, which qwen3_moe does where
# norm_topk_prob says so; GLM-4.5V's attention has no q/k norms, whatever a use_qk_norm
# key says (glm4_moe would expect them)
_NO_WINDOW = {"use_sliding_window": False, "layer_types": None}
IGNORED_BY_TEXT = {
    "qwen3_vl_text": _NO_WINDOW,
    "qwen3_vl_moe_text": {**_NO_WINDOW, "norm_topk_prob": True},
    "glm4v_moe_text": {"use_qk_norm": False},
}
# multimodal types whose checkpoint stacks each layer's experts, gate then up along one
# axis: [E, hidden, 2 × width] and [E, width, hidden] (transposed: Qwen3-VL-MoE's), or
# [E, 2 × width, hidden] and [E, hidden, width] (as transformers' modules hold them:
# Qwen3.5's, which transformers loads unconverted): written one expert at a time in the
# text family's layout (experts.{e}.gate_proj, up_proj, down_proj), which every consumer
# and plain transformers read. model_type -> whether transposed
STACKED_EXPERTS = {"qwen3_vl_moe": True, "qwen3_5_moe": False}
# multimodal types whose published config keeps the language model's keys at the top level
FLAT_TEXT = ("qwen2_vl", "qwen2_5_vl")
# the vision part's tensors where the language model's are prefixed `model.` alone
VISION_PREFIXES = ("visual.", "model.visual.")
# tensor name prefixes of the language model -> the text model's own
TEXT_PREFIXES = (
    ("language_model.model.", "model."),
    ("model.language_model.", "model."),
    ("model.text_model.", "model."),
    ("language_model.lm_head.", "lm_head."),
    ("lm_head.", "lm_head."),
)


# checkpoints of another family's model under names of their own: model_type -> the family
# read, the (pattern, replacement) renames of its tensor names and the fused rows split
# apart, which transformers applies as it loads them. Each is read once into the cache as
# that family's folder, and the artifact is the family's.
@dataclass(frozen=True)
class Renamed:
    family: str
    renames: tuple[tuple[str, str], ...]
    # a fused projection (renamed name's last module) -> the modules its rows go to, in
    # order; their widths from the config (FUSED_WIDTHS)
    fused: tuple[str, tuple[str, ...]] | None = None


# Bailing's names (Ling, Sarvam, Param-2): a fused query_key_value, `dense` for o_proj
_BAILING = (
    (r"^model\.word_embeddings\.", "model.embed_tokens."),
    (r"\.attention\.dense\.", ".self_attn.o_proj."),
    (r"\.attention\.query_layernorm\.", ".self_attn.q_norm."),
    (r"\.attention\.key_layernorm\.", ".self_attn.k_norm."),
    (r"\.attention\.", ".self_attn."),
    (r"\.mlp\.gate\.expert_bias$", ".mlp.gate.e_score_correction_bias"),
)
_BAILING_QKV = ("query_key_value", ("q_proj", "k_proj", "v_proj"))
RENAMED = {
    # EXAONE 3.0 and 3.5 (`ExaoneForCausalLM`), which transformers runs as LlamaForCausalLM
    "exaone": Renamed(
        "llama",
        (
            (r"^transformer\.wte\.", "model.embed_tokens."),
            (r"^transformer\.h\.", "model.layers."),
            (r"^transformer\.ln_f\.", "model.norm."),
            (r"\.attn\.attention\.out_proj\.", ".self_attn.o_proj."),
            (r"\.attn\.attention\.", ".self_attn."),
            (r"\.ln_1\.", ".input_layernorm."),
            (r"\.ln_2\.", ".post_attention_layernorm."),
            (r"\.mlp\.c_fc_0\.", ".mlp.gate_proj."),
            (r"\.mlp\.c_fc_1\.", ".mlp.up_proj."),
            (r"\.mlp\.c_proj\.", ".mlp.down_proj."),
        ),
    ),
    # Sarvam-30B (`SarvamMoEForCausalLM`) and Param-2 17B-A2.4B (`Param2MoeForCausalLM`),
    # which transformers runs as Glm4MoeForCausalLM (rotating whole heads)
    "sarvam_moe": Renamed("glm4_moe", _BAILING, _BAILING_QKV),
    "param2moe": Renamed("glm4_moe", _BAILING, _BAILING_QKV),
}


def fused_widths(config: dict) -> tuple[int, ...]:
    """The rows of a fused [q | k | v] projection each of q, k, v holds."""
    heads = config["num_attention_heads"]
    kv = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    return heads * head_dim, kv * head_dim, kv * head_dim


# the source's files a text-only folder keeps beside the weights
KEPT_FILES = (
    "tokenizer*",
    "special_tokens_map.json",
    "*.model",
    "*.jinja",
    "chat_template*",
    "generation_config.json",
)


def is_renamed(config: dict) -> bool:
    """Whether the checkpoint is another family's model under names of its own (RENAMED)."""
    return config.get("model_type") in RENAMED


def is_multimodal(config: dict) -> bool:
    model_type = config.get("model_type")
    if model_type in FLAT_TEXT and "vision_config" in config:
        return True
    return model_type in MULTIMODAL and isinstance(config.get("text_config"), dict)


def text_name(name: str, model_type: str) -> str | None:
    """The text model's name for a tensor of the multimodal checkpoint (None: not text);
    a RENAMED checkpoint's under the family's names."""
    if model_type in RENAMED:
        for pattern, to in RENAMED[model_type].renames:
            name = re.sub(pattern, to, name)
        return name
    for prefix, to in TEXT_PREFIXES:
        if name.startswith(prefix):
            return to + name[len(prefix) :]
    if (
        model_type in FLAT_TEXT
        and name.startswith("model.")
        and not name.startswith(VISION_PREFIXES)
    ):
        return name  # Qwen2-VL's and Qwen2.5-VL's published layout: model.layers beside visual.
    return None


def _outer_text(config: dict) -> dict:
    """The language model's keys: text_config, or the top level of a flat config."""
    if isinstance(config.get("text_config"), dict):
        return dict(config["text_config"])
    skip = ("vision_config", "architectures", "model_type", "auto_map")
    return {k: v for k, v in config.items() if k not in skip and not k.startswith("vision_")}


def _single_rope(rope: dict | None) -> dict | None:
    """M-RoPE's settings as the text family's rope (text alone: one position thrice)."""
    if not isinstance(rope, dict) or "mrope_section" not in rope:
        return rope
    rope = {k: v for k, v in rope.items() if k not in ("mrope_section", "mrope_interleaved")}
    for key in ("type", "rope_type"):
        if rope.get(key) in ("mrope", "default"):
            rope[key] = "default"
    return rope


def text_config(config: dict, has_head: bool | None = None) -> dict:
    """The language model's config.json: text_config as its own model type, with what the
    outer config states for the whole model (dtype, tying) where text_config is silent.
    `has_head` (whether the checkpoint holds an lm_head) decides the tying where given:
    the two configs disagree in published files (Mistral3Config ties by default, where
    Mistral Small 3.1's text_config says untied and its lm_head is stored), and the
    tensors are what the model was trained with. A RENAMED checkpoint's config as its
    family's, the keys its config class maps (EXAONE's num_layers) under their own names."""
    if is_renamed(config):
        from compress.model.spec import hf_config

        family = RENAMED[config["model_type"]].family
        text = {k: v for k, v in hf_config(config).to_dict().items() if k != "auto_map"}
        text.update(model_type=family, architectures=[ADAPTERS[family].architecture])
        if has_head is not None:
            text["tie_word_embeddings"] = not has_head
        return text
    text = _outer_text(config)
    model_type = text.get("model_type") or MULTIMODAL[config["model_type"]]
    text.update(IGNORED_BY_TEXT.get(model_type, {}))
    model_type = MROPE_TEXT.get(model_type, model_type)
    for key in ("rope_scaling", "rope_parameters"):
        if key in text:
            text[key] = _single_rope(text[key])
    if model_type not in ADAPTERS:
        raise LlmpressError(
            f"the language model of this {config['model_type']} checkpoint is a {model_type} "
            f"model, a family llmpress does not support (it reads {', '.join(ADAPTERS)})"
        )
    arch = ADAPTERS[model_type].architecture
    for key in ("tie_word_embeddings", "dtype", "torch_dtype", "transformers_version"):
        if key not in text and key in config:
            text[key] = config[key]
    text.update(model_type=model_type, architectures=[arch])
    if has_head is not None:
        text["tie_word_embeddings"] = not has_head
    return text


def text_part(
    path: Path, config: dict, files: list[Path], weights_sha256, carried: dict | None = None
) -> Path:
    """The cached text-only folder of the multimodal checkpoint at `path` (its safetensors
    `files`); `weights_sha256(files)` hashes the source's weights as a Checkpoint does;
    `carried`: what the folder `path` itself was made from (an FP8 checkpoint), recorded
    too. A language model of a family llmpress lacks is refused by the caller first
    (loading.py, before any FP8 conversion)."""
    target = conversion_target("text", path, config, files)
    if (target / "config.json").is_file():
        return target
    arch = (config.get("architectures") or [config["model_type"]])[0]
    origin = {
        "path": str(path),
        ("renamed_from" if is_renamed(config) else "text_part_of"): arch,
        "sha256": weights_sha256(files),
        **(carried or {}),
    }
    return publish_conversion(target, lambda tmp: _write(path, config, files, tmp), origin)


_STACKED = re.compile(r"\.mlp\.experts\.(gate_up_proj|down_proj)$")


def _unstacked(name: str, stacked, transposed: bool) -> dict:
    """One layer's stacked experts as per-expert linears ([out, in], contiguous)."""
    stem = name[: -len(name.split(".")[-1])]
    if transposed:  # [E, in, out] on disk
        stacked = stacked.transpose(1, 2)
    out = {}
    if name.endswith("gate_up_proj"):  # [E, 2 × width, hidden]
        width = stacked.shape[1] // 2
        for e in range(stacked.shape[0]):
            out[f"{stem}{e}.gate_proj.weight"] = stacked[e, :width].contiguous()
            out[f"{stem}{e}.up_proj.weight"] = stacked[e, width:].contiguous()
    else:  # down_proj [E, hidden, width]
        for e in range(stacked.shape[0]):
            out[f"{stem}{e}.down_proj.weight"] = stacked[e].contiguous()
    return out


def _split(name: str, fused, parts: tuple[str, ...], widths: tuple[int, ...], path: Path):
    """A fused projection's weight or bias as its parts' (rows in order)."""
    if fused.shape[0] != sum(widths):
        raise LlmpressError(
            f"{path}: {name} has {fused.shape[0]} rows where the config's heads give "
            f"{sum(widths)} ({' + '.join(map(str, widths))}): the config is not this "
            "checkpoint's; re-download it"
        )
    stem, leaf = name.rsplit(".", 2)[0], name.rsplit(".", 1)[1]
    rows = fused.split(list(widths))
    return {f"{stem}.{part}.{leaf}": r.contiguous() for part, r in zip(parts, rows, strict=True)}


def _write(path: Path, config: dict, files: list[Path], out: Path) -> None:
    from safetensors import safe_open
    from safetensors.torch import save_file

    weight_map: dict[str, str] = {}
    renamed = RENAMED.get(config["model_type"])
    fused = renamed.fused if renamed else None
    widths = fused_widths(text_config(config)) if fused else ()
    for f in files:
        with safe_open(str(f), "pt") as src:
            names = [(n, text_name(n, config["model_type"])) for n in src.keys()]  # noqa: SIM118
            tensors = {}
            for n, to in names:
                if to is None:
                    continue
                if config["model_type"] in STACKED_EXPERTS and _STACKED.search(to):
                    transposed = STACKED_EXPERTS[config["model_type"]]
                    tensors.update(_unstacked(to, src.get_tensor(n), transposed))
                elif fused and to.split(".")[-2] == fused[0]:
                    tensors.update(_split(to, src.get_tensor(n), fused[1], widths, path))
                else:
                    tensors[to] = src.get_tensor(n)
        if tensors:
            save_file(tensors, str(out / f.name), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(tensors, f.name))
    if not weight_map:
        raise LlmpressError(
            f"{path} is a {config['model_type']} checkpoint with no language-model tensors "
            "(expected names starting with language_model.model.): re-download it"
        )
    if len(set(weight_map.values())) > 1:
        index = {"metadata": {}, "weight_map": dict(sorted(weight_map.items()))}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    text = text_config(config, has_head="lm_head.weight" in weight_map)
    (out / "config.json").write_text(json.dumps(text, indent=2))
    for pattern in KEPT_FILES:
        for f in path.glob(pattern):
            if f.is_file():
                shutil.copy2(f, out / f.name)
