"""Reading an FP8 checkpoint as the dense model it stands for: peak memory and time of the
one-time conversion, by depth, and `compress` from it.

The checkpoints have Llama-3-8B's widths (hidden 4096, MLP 14,336, 32 heads of 128, 8 KV
heads, vocabulary 128,256, untied head) at a few depths, in the format Qwen3's -FP8
releases, MiniMax-M2 and GLM-4.5-FP8 ship (config.json `quant_method: fp8`, each block
linear float8 e4m3 beside a `weight_scale_inv` per 128 x 128 block; embedding, norms and
head bf16), from random bf16 weights. Each depth's conversion runs as `llmpress inspect`
in a process of its own with an empty LLMPRESS_CACHE (peak RSS sampled as
benchmarks/scale.py does), and one linear of the written dense model is checked against
its codes times its scales. Then `llmpress compress --quant rtn:w4g64` from the FP8
checkpoint at the first depth: what a user runs.

    python benchmarks/fp8_source.py --depths 4,16
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from random_checkpoint import SHAPES, config_json, tensor_shapes  # noqa: E402
from scale import LLMPRESS, measure  # noqa: E402

from compress.artifact.stream_safetensors import write_produced  # noqa: E402

BLOCK = 128
E4M3_MAX = 448.0
LINEARS = ("_proj.weight",)


def quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float8 e4m3 codes of `w` [N, K] and one scale per BLOCK x BLOCK block (N, K
    multiples of BLOCK at these widths)."""
    n, k = w.shape
    blocks = w.float().reshape(n // BLOCK, BLOCK, k // BLOCK, BLOCK)
    scale = blocks.abs().amax(dim=(1, 3)) / E4M3_MAX
    codes = (blocks / scale[:, None, :, None]).reshape(n, k).to(torch.float8_e4m3fn)
    return codes, scale


def write_fp8(shape, folder: Path, tokenizer_from: Path) -> dict:
    """The checkpoint, tensor by tensor; returns one linear's codes and scales to check."""
    shapes = tensor_shapes(shape)
    gen = torch.Generator().manual_seed(0)
    pending: dict[str, torch.Tensor] = {}  # a linear's scales, written right after it
    kept = {}
    specs = []
    for name, dims in shapes.items():
        if name.endswith(LINEARS):
            specs.append((name, "F8_E4M3", list(dims)))
            specs.append((f"{name}_scale_inv", "F32", [dims[0] // BLOCK, dims[1] // BLOCK]))
        else:
            specs.append((name, "BF16", list(dims)))

    def produce(name: str) -> torch.Tensor:
        if name in pending:
            return pending.pop(name)
        dims = shapes[name]
        if name.endswith("norm.weight"):
            return torch.ones(dims, dtype=torch.bfloat16)
        w = (torch.randn(dims, generator=gen) * 0.02).to(torch.bfloat16)
        if not name.endswith(LINEARS):
            return w
        codes, scale = quantize(w)
        pending[f"{name}_scale_inv"] = scale
        if not kept:
            kept.update(name=name, codes=codes, scale=scale)
        return codes

    folder.mkdir(parents=True)
    write_produced(folder, specs, produce, 5 * 10**9)
    config = config_json(shape)
    config["quantization_config"] = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [BLOCK, BLOCK],
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    for f in tokenizer_from.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy2(f, folder / f.name)
    return kept


def dense_matches(cache: Path, kept: dict) -> bool:
    """The written dense weight of the kept linear equals its codes times its block's
    scale (rounded to bf16, the checkpoint's dtype)."""
    from safetensors import safe_open

    (folder,) = [p for p in cache.iterdir() if p.name.startswith("fp8-")]
    index = folder / "model.safetensors.index.json"
    file = (
        folder / json.loads(index.read_text())["weight_map"][kept["name"]]
        if index.is_file()
        else folder / "model.safetensors"
    )
    with safe_open(str(file), "pt") as f:
        got = f.get_tensor(kept["name"])
    scale = kept["scale"].repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)
    want = (kept["codes"].float() * scale).to(torch.bfloat16)
    return got.dtype == torch.bfloat16 and torch.equal(got, want)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--depths", default="4,16")
    ap.add_argument("--shape", default="llama-3-8b")
    ap.add_argument("--work", type=Path, help="folder for the checkpoints (default: a temp dir)")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()
    from compress.model.default import convert_gguf, default_gguf

    tokenizer = convert_gguf(default_gguf())
    base = SHAPES[args.shape]
    work = Path(tempfile.mkdtemp(dir=args.work))
    rows = []
    try:
        for i, depth in enumerate(int(d) for d in args.depths.split(",")):
            shape = replace(base, layers=depth)
            src = work / f"fp8-{depth}"
            kept = write_fp8(shape, src, tokenizer)
            fp8_gb = sum(f.stat().st_size for f in src.glob("*.safetensors")) / 1e9
            cache = work / f"cache-{depth}"
            env = {**os.environ, "LLMPRESS_CACHE": str(cache)}
            convert = measure([*LLMPRESS, "inspect", str(src)], work / "inspect.log", env)
            (folder,) = [p for p in cache.iterdir() if p.name.startswith("fp8-")]
            dense_gb = sum(f.stat().st_size for f in folder.glob("*.safetensors")) / 1e9
            row = {
                "depth": depth,
                "fp8_gb": round(fp8_gb, 2),
                "dense_gb": round(dense_gb, 2),
                "convert": convert,
                "dense_equals_codes_times_scales": dense_matches(cache, kept),
            }
            if i == 0:
                out = work / "w4"
                cmd = [*LLMPRESS, "compress", str(src), "-o", str(out), "--quant", "rtn:w4g64"]
                row["compress"] = measure(cmd, work / "compress.log", env)
                shutil.rmtree(out)
            print(json.dumps(row), flush=True)
            rows.append(row)
            shutil.rmtree(src)
            shutil.rmtree(cache)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    from batched_decode import cpu_flags

    record = {
        "command": f"python benchmarks/fp8_source.py --depths {args.depths}",
        "shape": args.shape,
        "cpu": cpu_flags(),
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fp8_source.json").write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
