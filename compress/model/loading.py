"""Resolve what the user named (folder, GGUF file, hub id, `default`) into a checked checkpoint."""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from urllib.parse import urlparse

import torch

from compress.artifact.integrity import check_artifact
from compress.errors import LlmpressError
from compress.model.adapters import (
    Adapter,
    ModelShape,
    adapter_for,
    check_config,
    dense_shapes,
)
from compress.model.aliases import install_aliases
from compress.model.default import convert_gguf, default_gguf
from compress.model.fp8_source import dense_folder as fp8_dense_folder
from compress.model.fp8_source import is_fp8
from compress.model.known_hash import known_sha256
from compress.model.safetensors_check import check_safetensors
from compress.model.spec import hf_config
from compress.model.text_part import is_multimodal, is_renamed, text_config, text_part

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_HUB_FILES = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt", "*.jinja"]
# Mistral's repositories hold their weights twice: in Hugging Face's shards, which llmpress
# reads, and once more in their own format (consolidated.safetensors, 48 GB for Mistral
# Small 3.1), which it would download for nothing
_HUB_SKIPPED = ["consolidated*"]


@dataclass
class Checkpoint:
    """A local folder with config.json and safetensors weights, checked and understood."""

    source: str
    path: Path
    config: dict
    adapter: Adapter
    files: list[Path] = field(default_factory=list)

    @property
    def num_layers(self) -> int:
        return int(self.config["num_hidden_layers"])

    @property
    def is_quantized(self) -> bool:
        return "quantization_config" in self.config

    @cached_property
    def sha256(self) -> str:
        """Hash of the weights as the user supplied them (the GGUF file for converted ones)."""
        origin = self.path / "llmpress_source.json"
        if origin.is_file():
            return json.loads(origin.read_text())["sha256"]
        return weights_sha256(self.files)

    @cached_property
    def origin(self) -> dict:
        """What a folder llmpress made from the user's checkpoint records of it (a GGUF
        conversion, a multimodal text part, an FP8 checkpoint's dense weights); {} else."""
        origin = self.path / "llmpress_source.json"
        return json.loads(origin.read_text()) if origin.is_file() else {}

    @property
    def text_part_of(self) -> str | None:
        """The multimodal architecture whose language model this folder holds (text_part)."""
        return self.origin.get("text_part_of")

    @property
    def renamed_from(self) -> str | None:
        """The architecture whose checkpoint this folder holds under its family's names
        (text_part.RENAMED: EXAONE's), or None."""
        return self.origin.get("renamed_from")

    @property
    def dequantized_from(self) -> str | None:
        """The storage its weights were read from ("fp8": fp8_source.py), or None."""
        return self.origin.get("dequantized_from")

    @cached_property
    def tensors(self) -> dict[str, tuple[Path, tuple[int, ...], str]]:
        """Each tensor's file, shape and dtype, from the safetensors headers alone."""
        info: dict[str, tuple[Path, tuple[int, ...], str]] = {}
        stale = tuple(f".{n}" for n in self.adapter.stale_tensors)
        for f in self.files:
            for name, entry in check_safetensors(f).items():
                if name == "__metadata__" or (stale and name.endswith(stale)):
                    continue
                if name in info:  # which copy a loader takes depends on file order
                    raise LlmpressError(
                        f"tensor {name} is in both {info[name][0].name} and {f.name} of "
                        f"{self.path}: remove the stray file (or add the checkpoint's "
                        "model.safetensors.index.json)"
                    )
                info[name] = (f, tuple(entry["shape"]), entry["dtype"])
        return info


def weights_sha256(files: list[Path]) -> str:
    """The hash a checkpoint's weights are recorded by: the file's, or of every file's."""
    if len(files) == 1:
        return known_sha256(files[0])
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f.name}:{known_sha256(f)}\n".encode())
    return h.hexdigest()


def resolve(source: str) -> Checkpoint:
    """Find and check the checkpoint `source` names, refusing bad input before any heavy work."""
    if source == "default":
        return _open_folder(convert_gguf(default_gguf()), source)
    path = Path(source).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return _open_folder(convert_gguf(path), source)
    if path.is_dir():
        return _open_folder(path, source)
    if path.exists():
        raise LlmpressError(
            f"{source} is neither a model folder nor a .gguf file: pass a Hugging Face folder "
            "(config.json + safetensors), a .gguf file, a hub id or `default`"
        )
    if _HUB_ID.match(source) and not source.startswith((".", "/")):
        return _open_folder(_download(source), source)
    raise LlmpressError(f"no such model folder or file: {source}")


def _open_folder(path: Path, source: str) -> Checkpoint:
    check_artifact(path, known_sha256)  # a damaged artifact is named before anything reads it
    config_path = path / "config.json"
    if not config_path.is_file():
        raise LlmpressError(f"{path} has no config.json: pass a Hugging Face model folder")
    config = _read_json(config_path, "re-download it")
    if not isinstance(config, dict):
        raise LlmpressError(f"{config_path} is not a JSON object of settings; re-download it")
    hash_of, carried = weights_sha256, {}
    if is_multimodal(config):
        text_config(config)  # a language model llmpress lacks: refused before any conversion
    if is_fp8(config, _weight_files(path)[0]):  # the dense model it stands for, made once
        path = fp8_dense_folder(path, config, _weight_files(path)[0], weights_sha256)
        config = _read_json(path / "config.json", "remove it from the cache and rerun")
        origin = json.loads((path / "llmpress_source.json").read_text())
        hash_of = lambda _files: origin["sha256"]  # noqa: E731 - the FP8 files', not the copy's
        carried = {"dequantized_from": origin["dequantized_from"]}
    # its language model (or EXAONE's, under llama's names), as a folder made once
    if is_multimodal(config) or is_renamed(config):
        path = text_part(path, config, _weight_files(path)[0], hash_of, carried)
        config = _read_json(path / "config.json", "remove it from the cache and rerun")
    adapter = adapter_for(config)
    shape = check_config(config, str(config_path))
    files, index = _weight_files(path)
    ckpt = Checkpoint(source=source, path=path, config=config, adapter=adapter, files=files)
    _check_index(path, index, ckpt.tensors)  # reading the headers checks every file
    _check_tensors(ckpt, shape)
    return ckpt


def check_context(ckpt: Checkpoint, tokens: int, what: str) -> None:
    """Refuse `tokens` positions past the model's context (max_position_embeddings): its
    rotary positions end there, and the memory of a longer run grows without bound."""
    limit = ckpt.adapter.shape(ckpt.config).max_positions
    if tokens > limit:
        raise LlmpressError(
            f"{what}: {tokens} tokens exceed the context of {ckpt.source} "
            f"({limit} tokens, max_position_embeddings); give at most {limit}"
        )


def _read_json(path: Path, fix: str) -> object:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise LlmpressError(f"{path} is not valid JSON ({e}); {fix}") from None


def _weight_files(path: Path) -> tuple[list[Path], dict[str, str] | None]:
    """The safetensors files (and the index's tensor → file map, if there is an index)."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = _read_index(index)
        files = sorted({path / name for name in weight_map.values()})
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise LlmpressError(
                f"{path} is missing shard(s) {', '.join(missing)} listed in its index; "
                "download the whole checkpoint"
            )
        return files, weight_map
    files = sorted(path.glob("*.safetensors"))
    if not files:
        bins = list(path.glob("*.bin")) + list(path.glob("*.pt"))
        hint = (
            " (it has PyTorch .bin weights: re-save them with safe_serialization)" if bins else ""
        )
        raise LlmpressError(f"{path} has no .safetensors weights{hint}")
    return files, None


def _read_index(index: Path) -> dict[str, str]:
    """The index's weight_map, refused unless it maps tensor names to shard files that
    lie in the folder itself."""
    data = _read_json(index, "re-download the checkpoint")
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    fix = "re-download the checkpoint (or delete the index of a single-file one)"
    if not isinstance(weight_map, dict) or not weight_map:
        raise LlmpressError(f"{index} has no `weight_map` of tensor names to files; {fix}")
    for name, file in weight_map.items():
        if (
            not isinstance(file, str)
            or Path(file).name != file
            or not file.endswith(".safetensors")
        ):
            raise LlmpressError(
                f"{index} maps {name!r} to {file!r}, not a .safetensors file in the folder; {fix}"
            )
    return weight_map


def _check_index(path: Path, weight_map: dict[str, str] | None, tensors: dict) -> None:
    """Every tensor the index lists is in the shard it names."""
    for name, file in (weight_map or {}).items():
        if name not in tensors or tensors[name][0].name != file:
            raise LlmpressError(
                f"{path}: the index puts tensor {name!r} in {file}, which does not hold it; "
                "re-download the checkpoint"
            )


_FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")
_BLOCK = re.compile(r"\.(\d+)\.")


def _check_tensors(ckpt: Checkpoint, shape: ModelShape) -> None:
    """Refuse a checkpoint whose tensors disagree with its config.json: a missing tensor,
    a shape the sizes do not imply, an integer norm or embedding, or more blocks than the
    config names, before any work trips over them."""
    fix = "the checkpoint does not match its config.json: re-export it or fix config.json"
    adapter, tensors = ckpt.adapter, ckpt.tensors
    linears = {f"{n}.weight" for n in adapter.linear_names(shape.layers)}
    linears.add(f"{adapter.lm_head}.weight")
    for name, dims in dense_shapes(adapter, shape).items():
        quantized = ckpt.is_quantized and name in linears  # may be integers, or packed
        if name not in tensors:
            if not _stored_otherwise(ckpt, name, quantized):
                raise LlmpressError(f"{ckpt.path}: tensor {name} is missing; {fix}")
            continue
        _, got, dtype = tensors[name]
        if got != dims:
            raise LlmpressError(
                f"{ckpt.path}: tensor {name} has shape {list(got)}, config.json implies "
                f"{list(dims)}; {fix}"
            )
        if dtype not in _FLOAT_DTYPES and not quantized:
            raise LlmpressError(f"{ckpt.path}: tensor {name} is {dtype}, not floating point; {fix}")
    prefix = adapter.blocks + "."
    blocks = {
        int(m[1])
        for n in tensors
        if n.startswith(prefix) and (m := _BLOCK.match(n, len(prefix) - 1))
    }
    # ERNIE 4.5 MoE's with use_bias (none published); phi's is read (Adapter.head_bias)
    if f"{adapter.lm_head}.bias" in tensors and not adapter.head_bias:
        raise LlmpressError(
            f"{ckpt.path}: its output projection has a bias ({adapter.lm_head}.bias), which "
            "llmpress does not compute yet; open an issue with the model's config.json"
        )
    carried = 0  # next-token-prediction blocks after the model's own (GLM-4.5's MTP)
    if adapter.predictor_layers:
        carried = int(getattr(hf_config(ckpt.config), adapter.predictor_layers, 0) or 0)
    extra = sorted(i for i in blocks if i >= shape.layers + carried)
    if extra:
        raise LlmpressError(
            f"{ckpt.path}: holds block {extra[0]} but config.json's num_hidden_layers is "
            f"{shape.layers}; {fix}"
        )


def _stored_otherwise(ckpt: Checkpoint, name: str, quantized_linear: bool) -> bool:
    """Whether a tensor absent as `name` is legitimately so: a tied lm_head, or a quantized
    linear stored as integers and scales under the same module name."""
    if name == f"{ckpt.adapter.lm_head}.weight" and ckpt.adapter.spec(ckpt.config).tied:
        return True
    module = name.removesuffix("weight")
    return quantized_linear and any(n.startswith(module) for n in ckpt.tensors)


def _hub_reachable(timeout: float = 3.0) -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def _download(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download

    try:
        return Path(
            snapshot_download(
                repo_id,
                allow_patterns=_HUB_FILES,
                ignore_patterns=_HUB_SKIPPED,
                local_files_only=True,
            )
        )
    except Exception:  # not in the local hub cache: fall through to a download
        pass
    if not _hub_reachable():
        raise LlmpressError(
            f"{repo_id!r} is no folder under {Path.cwd()} and, read as a hub id, cannot be "
            "downloaded: the Hugging Face Hub cannot be reached (offline); pass the path of a "
            "local model folder"
        )
    try:
        return Path(
            snapshot_download(repo_id, allow_patterns=_HUB_FILES, ignore_patterns=_HUB_SKIPPED)
        )
    except Exception as e:
        raise LlmpressError(f"cannot download {repo_id!r} from the Hugging Face Hub: {e}") from e


def _chunks(t: torch.Tensor, elements: int = 1 << 20):
    flat = t.reshape(-1)
    return (flat[i : i + elements] for i in range(0, flat.numel(), elements))


_SUMMED = (torch.float16, torch.bfloat16, torch.float32)


def _all_finite(t: torch.Tensor) -> bool:
    """In slices of 1M values: a whole-tensor check makes temporaries several times the
    tensor's size (a 128k-vocabulary embedding: 2 GB), the largest allocation of a run.
    A slice's fp32 sum is finite when every value is (a NaN or an infinity carries into
    it); one reduction, where `isfinite` took three passes and two temporaries: a
    Llama-3.2-1B-shaped checkpoint's 1.2G bf16 values in 0.19 s against 2.5 s. A sum that
    overflows with finite values only is looked at again with `isfinite`."""
    if t.dtype not in _SUMMED:
        return all(bool(torch.isfinite(c).all()) for c in _chunks(t))
    return all(
        bool(torch.isfinite(c.sum(dtype=torch.float32))) or bool(torch.isfinite(c).all())
        for c in _chunks(t)
    )


def read_tensors(ckpt: Checkpoint, names: list[str] | None = None) -> dict[str, torch.Tensor]:
    """Read tensors (all, or `names`) from the checkpoint, refusing non-finite weights."""
    return dict(each_tensor(ckpt, names))


_STORED = {
    "BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2, "I16": torch.int16, "U16": torch.uint16,
    "F16": torch.float16, "BF16": torch.bfloat16, "I32": torch.int32, "U32": torch.uint32,
    "F32": torch.float32, "I64": torch.int64, "U64": torch.uint64, "F64": torch.float64,
}  # fmt: skip


def _stored(path: Path, wanted: set[str] | None):
    """(name, tensor) of one safetensors file, each read into memory of its own by plain
    reads. safe_open maps the file, and every page a read touched counted in the
    process's resident memory until the file was closed: a DeepSeek-V2-Lite-shaped
    block's 1.2 GB on top of its fp32 copy, or not, as the kernel's timing fell (rtn's
    peak moved between 3.7 and 4.8 GB from run to run)."""
    stat = path.stat()
    base, header = _header(str(path), stat.st_size, stat.st_mtime_ns)
    names = sorted(n for n in header if n != "__metadata__" and (wanted is None or n in wanted))
    if not names:  # a shard without any of them is not opened
        return
    with open(path, "rb") as f:
        for name in names:
            entry = header[name]
            tensor = torch.empty(entry["shape"], dtype=_STORED[entry["dtype"]], device="cpu")
            raw = memoryview(tensor.reshape(-1).view(torch.uint8).numpy())
            f.seek(base + entry["data_offsets"][0])
            done = 0
            while done < len(raw):
                got = f.readinto(raw[done:])
                if not got:
                    raise LlmpressError(f"{path} ended inside tensor {name}: re-download it")
                done += got
            yield name, tensor


@lru_cache(maxsize=256)
def _header(path: str, size: int, mtime_ns: int) -> tuple[int, dict]:
    """Where a file's data starts, and its validated header: read once while the file is
    unchanged, not again for every block the walk reads from it."""
    header = check_safetensors(Path(path))  # offsets, sizes and dtypes
    with open(path, "rb") as f:
        return 8 + int.from_bytes(f.read(8), "little"), header


def each_tensor(ckpt: Checkpoint, names: list[str] | None = None):
    """read_tensors' (name, tensor) pairs one at a time, for a reader that converts each
    and lets it go (a block widened to fp32 beside its whole stored copy held both)."""
    wanted = set(names) if names is not None else None
    for f in ckpt.files:
        for name, tensor in _stored(f, wanted):
            if tensor.is_floating_point() and not _all_finite(tensor):
                bad = sum(int((~torch.isfinite(c)).sum()) for c in _chunks(tensor))
                if bad:
                    raise LlmpressError(
                        f"weight {name} in {f.name} has {bad} NaN/Inf value(s) of "
                        f"{tensor.numel()}: the checkpoint is damaged; re-export it"
                    )
            yield name, tensor


def load_tokenizer(ckpt: Checkpoint):
    """The checkpoint's tokenizer; loaded once per process while its folder's files are
    unchanged (transformers parses tokenizer.json in Python as well: 0.22 s of a tiny
    model's 0.45 s compress, each time)."""
    files = (f for f in ckpt.path.iterdir() if f.is_file() and f.suffix != ".safetensors")
    stamp = tuple(sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files))
    try:
        return _tokenizer(str(ckpt.path.resolve()), stamp)
    except Exception as e:
        raise LlmpressError(
            f"no usable tokenizer in {ckpt.path} ({type(e).__name__}): copy the tokenizer files "
            "(tokenizer.json, tokenizer_config.json) of the original model into that folder"
        ) from e


@lru_cache(maxsize=4)
def _tokenizer(path: str, stamp: tuple):
    """`stamp` (the folder's files, sizes and times) keys the cache: a changed file loads
    afresh. Callers only encode and decode with it, never set state on it."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def build_model(config: dict, state_dict: dict[str, torch.Tensor], adapter: Adapter):
    """A transformers model from a config and a dense state dict, without random init."""
    from transformers import AutoModelForCausalLM

    from compress.model.spec import hf_config as transformers_config

    config = {k: v for k, v in config.items() if k != "quantization_config"}
    hf_config = transformers_config(config)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    spec = adapter.spec(config)
    if spec.mlp is not None:
        from compress.model.moe import install_experts

        install_experts(model, adapter, spec)
    install_aliases(model, adapter)
    model.to_empty(device="cpu")
    state_dict = adapter.model_names(state_dict)
    missing, unexpected = model.load_state_dict(state_dict, strict=False, assign=True)
    tied = {adapter.head_module + ".weight"} if hf_config.tie_word_embeddings else set()
    missing = [m for m in missing if m not in tied]
    if missing or unexpected:
        raise LlmpressError(
            f"checkpoint does not match its config.json: missing {missing[:3]}, "
            f"unexpected {unexpected[:3]}; re-export the checkpoint"
        )
    if hf_config.tie_word_embeddings:
        model.tie_weights()
    for name in adapter.derived_modules:  # buffers computed from the config, e.g. rotary
        parent, _, child = name.rpartition(".")
        owner = model.get_submodule(parent)
        held = getattr(owner, child)
        if held is None:  # (granitemoehybrid without rope builds none)
            continue
        if isinstance(held, torch.nn.ModuleList):  # granite_swa's: one per rope base, each
            for i, module in enumerate(held):  # built from a config of its own
                held[i] = type(module)(config=module.config)
        else:
            setattr(owner, child, type(held)(config=hf_config))
    _fill_init_buffers(model, adapter)
    return model.eval()


def _fill_init_buffers(model, adapter: Adapter) -> None:
    """Buffers a module computes at init and no checkpoint stores (gemma3's embedding
    scale, kept beside its float as `scalar_<buffer>`) are left empty by the meta-device
    build: fill them, and refuse one that cannot be rebuilt rather than compute with it."""
    derived = adapter.derived_modules
    for name, module in model.named_modules():
        if any(name == d or name.startswith(d + ".") for d in derived):
            continue
        for buffer in module._non_persistent_buffers_set:
            scalar = getattr(module, f"scalar_{buffer}", None)
            if scalar is None:
                raise LlmpressError(
                    f"{name}.{buffer} is computed when transformers builds the model and is "
                    "not in the checkpoint, which llmpress cannot rebuild; open an issue"
                )
            getattr(module, buffer).fill_(scalar)
