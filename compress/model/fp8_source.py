"""An FP8 checkpoint as the dense one it stands for, made once into a cached folder.

Several families are published in FP8 first or only: MiniMax-M2, Qwen3's `-FP8` releases,
Ministral 3, GLM-4.5's. Their config.json says `quant_method: fp8`; each quantized linear
stores `weight` as float8 (e4m3) beside `weight_scale_inv` (fp32): one scale per block of
`weight_block_size` (128 x 128 in DeepSeek-V3's format), per row, or per tensor (Mistral's,
whose static `activation_scale`s serve FP8 activations); AutoFP8's checkpoints name it
`weight_scale` (per tensor, beside a static `input_scale`), and so do compressed-tensors'
float-quantized checkpoints (per row: RedHat's FP8-dynamic). Either name multiplies: the
weight is the float8 value times its block's scale, so every command reads the checkpoint
as that dense model, written once in the config's 16-bit dtype (bfloat16, as transformers'
and vLLM's own dequantization computes it) with the scales, activation scales and FP8 KV
cache scales left out: the original eval compares against is the weights as published,
run with full-precision activations. Tensor by tensor, so memory is one tensor whatever
the model's size; the folder is keyed by the source's files (name, size, mtime) and
records the source's weight hash.
"""

from __future__ import annotations

import json
import math
import shutil
import struct
import sys
import time
from pathlib import Path

import torch

from compress.errors import LlmpressError
from compress.model.default import conversion_target, publish_conversion
from compress.model.safetensors_check import check_safetensors

SHARD_BYTES = 5 * 10**9
_FP8 = ("F8_E4M3", "F8_E5M2")
_INTEGER = {"I64", "I32", "I16", "I8", "U8", "BOOL"}
_TORCH = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
          "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16,
          "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
          "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}  # fmt: skip
_DTYPES = {"bfloat16": ("BF16", torch.bfloat16), "float16": ("F16", torch.float16),
           "float32": ("F32", torch.float32)}  # fmt: skip
# tensors the dense model has no use for: the weights' scales (applied here), static
# activation scales and an FP8 KV cache's (the dense model quantizes neither)
_DROPPED = ("weight_scale_inv", "weight_scale", "input_scale", "activation_scale",
            ".k_scale", ".v_scale", ".kv_scale")  # fmt: skip
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def is_fp8(config: dict, files: list[Path]) -> bool:
    """Whether the checkpoint is quantized to float8 alone: its config says quantized, its
    files hold float8 tensors and no integer ones (an integer-coded checkpoint, llmpress's
    artifacts among them, is its codec's to read). Told by the tensors, not the config's
    method name: `fp8` checkpoints and compressed-tensors' float-quantized ones (per row,
    `weight_scale`) are the same float8 codes times scales."""
    if not isinstance(config.get("quantization_config"), dict):
        return False
    float8 = False
    for f in files:  # an artifact's first file already holds its integer codes: stop there
        dtypes = {info["dtype"] for info in _header(f)[0].values()}
        if dtypes & _INTEGER:
            return False
        float8 = float8 or bool(dtypes & set(_FP8))
    return float8


def dense_config(config: dict) -> dict:
    """config.json of the dense model: the same, without its quantization_config."""
    return {k: v for k, v in config.items() if k != "quantization_config"}


def dequantize(w8: torch.Tensor, scale: torch.Tensor, block=None) -> torch.Tensor:
    """fp32 weights of float8 `w8` [..., N, K] and its scales: one per tensor, per row
    ([N] or [N, 1]), or per block of `block` [bn, bk] (a grid [ceil(N/bn), ceil(K/bk)],
    edge blocks partial). Without `block`, the grid must divide the weight: a 64-row
    weight in blocks of 48 has a 2-row grid, as it would in blocks of 32."""
    w = w8.float()
    s = scale.float()
    if s.numel() == 1:
        return w * s.reshape(())
    n, k = w.shape[-2:]
    if s.shape[-1] == 1 or s.dim() == w.dim() - 1:  # per row
        return w * s.reshape(*s.shape[: w.dim() - 2], n, 1)
    rows, cols = s.shape[-2:]
    if block is not None:
        bn, bk = (int(b) for b in block)
    elif n % rows == 0 and k % cols == 0:
        bn, bk = n // rows, k // cols
    else:
        bn = bk = 0
    if not bn or not bk or -(-n // bn) != rows or -(-k // bk) != cols:
        raise ValueError(
            f"scales {list(s.shape)} do not fit a {[n, k]} weight in blocks of "
            f"{list(block) if block else 'any size'}"
        )
    grid = s.repeat_interleave(bn, -2)[..., :n, :].repeat_interleave(bk, -1)[..., :k]
    return w * grid


def _say(line: str) -> None:
    """Progress on stderr: stdout may be a result someone parses (`inspect --json`)."""
    print(line, file=sys.stderr, flush=True)


def dense_folder(path: Path, config: dict, files: list[Path], weights_sha256, log=_say) -> Path:
    """The cached dense folder of the FP8 checkpoint at `path` (its safetensors `files`);
    `weights_sha256(files)` hashes the source's weights as a Checkpoint does."""
    target = conversion_target("fp8", path, config, files)
    if (target / "config.json").is_file():
        return target
    from compress.artifact.stream_safetensors import DTYPES  # it imports model/: not above

    specs, where = _plan(path, config, files)
    need = sum(DTYPES[d] * math.prod(s) for _, d, s in specs)
    target.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(target.parent).free
    if free < need * 1.05:
        raise LlmpressError(
            f"{path} is an FP8 checkpoint, read as the dense model it stands for: that needs "
            f"{need / 1e9:.1f} GB in {target.parent} and {free / 1e9:.1f} GB are free; free "
            "space there or point LLMPRESS_CACHE at a larger disk"
        )
    log(f"{path} is stored in FP8: writing its dense weights once ({need / 1e9:.1f} GB)")
    origin = {"path": str(path), "dequantized_from": "fp8", "sha256": weights_sha256(files)}
    write = lambda tmp: _write(path, config, specs, where, tmp, log)  # noqa: E731
    return publish_conversion(target, write, origin)


def _plan(path: Path, config: dict, files: list[Path]):
    """(name, dtype, shape) of every tensor the dense folder holds, and where each is:
    (file, its header entry, the file's data offset, its scale's entry or None, the dtype
    written); refused in one line where a float8 weight has no scale."""
    dense = config.get("dtype") or config.get("torch_dtype") or "bfloat16"
    out_dtype = _DTYPES.get(dense, _DTYPES["bfloat16"])[0]
    specs, where = [], {}
    for f in files:
        header, base = _header(f)
        for name, info in header.items():
            if name.endswith(_DROPPED):
                continue
            dtype, scale = info["dtype"], None
            if dtype in _FP8:  # its scale, by either name (both multiply the codes)
                scale = header.get(f"{name}_scale_inv") or header.get(f"{name}_scale")
                if scale is None:
                    raise LlmpressError(
                        f"{path}: {name} is stored in {dtype} without {name}_scale_inv (or "
                        f"{name}_scale) beside it in {f.name}; re-download the checkpoint"
                    )
                dtype = out_dtype
            specs.append((name, dtype, list(info["shape"])))
            where[name] = (f, info, base, scale, dtype)
    return specs, where


def _header(f: Path) -> tuple[dict, int]:
    """The file's checked header (tensors only) and where its data section starts."""
    header = check_safetensors(f)
    with open(f, "rb") as fh:
        (length,) = struct.unpack("<Q", fh.read(8))
    return {k: v for k, v in header.items() if k != "__metadata__"}, 8 + length


def _read(f: Path, info: dict, base: int) -> torch.Tensor:
    """One tensor read into memory of its own, not through a memory map: mapped, every
    tensor read stayed resident with its file (a 3 GB FP8 file's conversion peaked at
    3.8 GB where its largest tensor is 1 GB)."""
    begin, end = info["data_offsets"]
    buf = bytearray(end - begin)
    with open(f, "rb") as fh:
        fh.seek(base + begin)
        fh.readinto(buf)
    raw = torch.frombuffer(buf, dtype=torch.uint8) if buf else torch.empty(0, dtype=torch.uint8)
    return raw.view(_TORCH[info["dtype"]]).reshape(info["shape"])


def _write(path: Path, config: dict, specs, where, out: Path, log) -> None:
    from compress.artifact.stream_safetensors import write_produced

    start, done, total = time.perf_counter(), 0, len(specs)
    dtypes = dict(_DTYPES.values())  # "BF16" -> torch.bfloat16
    block = config["quantization_config"].get("weight_block_size")  # else told by the grid

    def produce(name: str) -> torch.Tensor:
        nonlocal done
        f, info, base, scale, dtype = where[name]
        t = _read(f, info, base)
        if scale is not None:
            try:
                t = dequantize(t, _read(f, scale, base), block).to(dtypes[dtype])
            except ValueError as e:
                raise LlmpressError(f"{path}: {name}'s {e}; re-download the checkpoint") from None
        done += 1
        if done % 200 == 0 or done == total:
            spent = time.perf_counter() - start
            log(f"FP8 to dense: {done}/{total} tensors ({spent:.0f} s, "
                f"ETA {spent / done * (total - done):.0f} s)")  # fmt: skip
        return t.contiguous()

    write_produced(out, specs, produce, SHARD_BYTES)
    (out / "config.json").write_text(json.dumps(dense_config(config), indent=2))
    skip = {"config.json", "model.safetensors.index.json"}
    for f in path.iterdir():  # the tokenizer and the rest, not other copies of the weights
        if f.is_file() and f.suffix not in _WEIGHT_SUFFIXES and f.name not in skip:
            shutil.copy2(f, out / f.name)
