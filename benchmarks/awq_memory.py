"""Peak memory of AWQ compression against model depth: it must stay flat.

Compresses the default model (30 blocks) and synthetic llama-family models of the same
width with 2× and 4× the blocks (random weights, written to safetensors here), each in
its own `llmpress compress` process, and reports each process's peak RSS. Sequential
calibration holds one block and the calibration activations, so the peak should not
grow with depth; only the quantized integers (1/8 of the fp32 linears) accumulate.

    python benchmarks/awq_memory.py [--samples 16] [--length 256] [--blocks 30 60 120]

The search is made coarse (5 α values, 4 search samples) to keep the 120-block run short:
memory does not depend on it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from compress.model.loading import resolve

HERE = Path(__file__).resolve().parent
DATA = HERE.parent.parent / "shared" / "data" / "wikitext-2-raw" / "valid.txt"


def synthetic(like: Path, layers: int, out: Path) -> Path:
    """The default model's config with `layers` blocks and random weights, in fp32."""
    config = json.loads((like / "config.json").read_text())
    config["num_hidden_layers"] = layers
    h, i = config["hidden_size"], config["intermediate_size"]
    kv = config["num_key_value_heads"] * (h // config["num_attention_heads"])
    gen = torch.Generator().manual_seed(layers)
    tensors = {
        "model.embed_tokens.weight": torch.randn(config["vocab_size"], h, generator=gen),
        "model.norm.weight": torch.ones(h),
    }
    shapes = {
        "self_attn.q_proj": (h, h),
        "self_attn.k_proj": (kv, h),
        "self_attn.v_proj": (kv, h),
        "self_attn.o_proj": (h, h),
        "mlp.gate_proj": (i, h),
        "mlp.up_proj": (i, h),
        "mlp.down_proj": (h, i),
    }
    for n in range(layers):
        for name, shape in shapes.items():
            tensors[f"model.layers.{n}.{name}.weight"] = torch.randn(*shape, generator=gen) * 0.02
        tensors[f"model.layers.{n}.input_layernorm.weight"] = torch.ones(h)
        tensors[f"model.layers.{n}.post_attention_layernorm.weight"] = torch.ones(h)
    out.mkdir(parents=True)
    save_file(tensors, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config))
    for f in like.iterdir():
        if f.name.startswith("tokenizer"):
            (out / f.name).write_bytes(f.read_bytes())
    return out


def peak_rss_mb(cmd: list[str]) -> tuple[float, float]:
    """Run `cmd`; return its peak resident memory (MB) and wall time (s)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr.read()[-2000:]}")
    return usage.ru_maxrss / 1024, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--blocks", type=int, nargs="+", default=[30, 60, 120])
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()
    default = resolve("default").path
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        recipe = Path(tmp) / "recipe.yaml"
        recipe.write_text(
            "stages:\n  - awq: {bits: 4, group_size: 64, zero_point: true, grid: 5,"
            " search_samples: 4}\n"
            f"calib: {{source: {DATA}, samples: {args.samples}, length: {args.length}}}\n"
        )
        for layers in args.blocks:
            model = (
                default if layers == 30 else synthetic(default, layers, Path(tmp) / f"m{layers}")
            )
            out = Path(tmp) / f"out{layers}"
            cmd = [
                sys.executable,
                "-m",
                "compress",
                "compress",
                str(model),
                "-o",
                str(out),
                "--recipe",
                str(recipe),
            ]
            rss, seconds = peak_rss_mb(cmd)
            weights_mb = sum(f.stat().st_size for f in model.glob("*.safetensors")) / 1e6
            rows.append(
                {
                    "blocks": layers,
                    "checkpoint_mb": round(weights_mb),
                    "peak_rss_mb": round(rss),
                    "seconds": round(seconds),
                }
            )
            print(rows[-1], flush=True)
    table = ["| blocks | checkpoint (fp32) MB | peak RSS MB | time s |", "|---|---|---|---|"]
    table += [
        f"| {r['blocks']} | {r['checkpoint_mb']} | {r['peak_rss_mb']} | {r['seconds']} |"
        for r in rows
    ]
    print("\n".join(table))
    args.out.mkdir(parents=True, exist_ok=True)
    settings = {"samples": args.samples, "length": args.length, "blocks": args.blocks}
    record = {"rows": rows, **settings}  # no paths: results are committed
    (args.out / "awq_memory.json").write_text(json.dumps(record, indent=2) + "\n")
    (args.out / "awq_memory.md").write_text("\n".join(table) + "\n")


if __name__ == "__main__":
    main()
