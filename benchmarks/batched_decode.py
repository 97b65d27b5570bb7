"""Batched decode and quantized-KV decode on the CPU runtime, one run, rounds interleaved.

The artifact is the issue's: `llmpress compress default --quant rtn:w4g64 --lm-head w8`.
Each round runs, in turn: batch 1, 8 and 32 with 32-token prompts and the fp32 cache;
batch 8 with the int8 cache at 32-token prompts; and batch 8 with 1024-token prompts on
the fp32, int8 and int4 caches. Figures are medians over the rounds (decode tokens/s of
all sequences together); the ratios are of medians measured in the same run. Memory
bandwidth and the fp32 matmul rate are measured (medians of repeats) before and after.

    python benchmarks/batched_decode.py [--rounds 5] [--long-rounds 3] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
from pathlib import Path

import torch

from compress.kernels.cpu import amx_active, set_threads
from compress.model.loading import resolve
from compress.pipeline import compress
from compress.recipe import parse_recipe
from compress.runtime.bench import bench_one, measure_bandwidth, measure_matmul_flops
from compress.runtime.kv_cache import parse_kv
from compress.runtime.weights import load_weights

HERE = Path(__file__).resolve().parent
FLAGS = (
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx_vnni",
    "avx512_bf16",
    "amx_int8",
)


def cpu_flags() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    have = set(line.split(":", 1)[-1].split())
    model = next(
        (ln.split(":", 1)[1].strip() for ln in text.splitlines() if "model name" in ln), ""
    )
    missing = [f for f in FLAGS if f not in have]
    tiles = ""
    if "amx_int8" in have:  # whether the kernels used them (LLMPRESS_AMX, the OS's grant)
        tiles = "; AMX tiles on" if amx_active() else "; AMX tiles off"
    return f"{model}; " + " ".join(f for f in FLAGS if f in have) + (
        f" (no {' '.join(missing)})" if missing else ""
    ) + tiles  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--long-rounds", type=int, default=3)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()
    set_threads(torch.get_num_threads())
    ceilings = {"bandwidth": [measure_bandwidth()], "matmul": [measure_matmul_flops()]}
    bw, fl = ceilings["bandwidth"][0], ceilings["matmul"][0]
    print(f"{cpu_flags()}; {torch.get_num_threads()} threads")
    print(f"bandwidth {bw / 1e9:.1f} GB/s, fp32 matmul {fl / 1e9:.0f} GFLOP/s")
    cases = [(f"batch {b}, prompt 32, fp32 KV", b, 32, "none") for b in (1, 8, 32)]
    cases.append(("batch 8, prompt 32, int8 KV", 8, 32, "int8"))
    long_cases = [
        (f"batch 8, prompt 1024, {kv} KV", 8, 1024, kv) for kv in ("none", "int8", "int4")
    ]
    runs: dict[str, list[dict]] = {name: [] for name, *_ in cases + long_cases}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "w4g64"
        recipe = parse_recipe({"stages": [{"rtn": {"bits": 4, "group_size": 64}}], "lm_head": "w8"})
        compress("default", recipe, out, log=lambda _: None)
        weights = load_weights(resolve(str(out)))
        for r in range(max(args.rounds, args.long_rounds)):
            todo = (cases if r < args.rounds else []) + (long_cases if r < args.long_rounds else [])
            for name, batch, prompt, kv in todo:
                res = bench_one(weights, batch, prompt, args.output_len, bw, fl, parse_kv(kv))
                runs[name].append(res.__dict__)
                print(f"round {r + 1} {name}: {res.tokens_per_s:.1f} tok/s", flush=True)
    ceilings["bandwidth"].append(measure_bandwidth())
    ceilings["matmul"].append(measure_matmul_flops())
    med = {n: statistics.median(x["tokens_per_s"] for x in rs) for n, rs in runs.items()}
    one = med["batch 1, prompt 32, fp32 KV"]
    ratios = {
        "batch 8 / batch 1": med["batch 8, prompt 32, fp32 KV"] / one,
        "batch 32 / batch 1": med["batch 32, prompt 32, fp32 KV"] / one,
        "int8 KV / fp32 KV, batch 8, prompt 32": med["batch 8, prompt 32, int8 KV"]
        / med["batch 8, prompt 32, fp32 KV"],
        "int8 KV / fp32 KV, batch 8, prompt 1024": med["batch 8, prompt 1024, int8 KV"]
        / med["batch 8, prompt 1024, none KV"],
        "int4 KV / fp32 KV, batch 8, prompt 1024": med["batch 8, prompt 1024, int4 KV"]
        / med["batch 8, prompt 1024, none KV"],
    }
    record = {
        "benchmark": "batched_decode",
        "artifact": "llmpress compress default --quant rtn:w4g64 --lm-head w8",
        "cpu": cpu_flags(),
        "threads": torch.get_num_threads(),
        "ceilings_before_after": ceilings,
        "output_len": args.output_len,
        "median_tokens_per_s": med,
        "ratios": ratios,
        "runs": runs,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "batched_decode.json").write_text(json.dumps(record, indent=2) + "\n")
    text = table(record)
    (args.out / "batched_decode.md").write_text(text + "\n")
    print(text)


def table(record: dict) -> str:
    c = record["ceilings_before_after"]
    lines = [
        f"CPU: {record['cpu']}; {record['threads']} threads. Memory bandwidth "
        + " / ".join(f"{b / 1e9:.1f}" for b in c["bandwidth"])
        + " GB/s and fp32 matmul "
        + " / ".join(f"{f / 1e9:.0f}" for f in c["matmul"])
        + " GFLOP/s (before / after).",
        f"Artifact: `{record['artifact']}`; {record['output_len']} tokens generated per sequence.",
        "",
        "| case | decode tok/s (median) | runs |",
        "|---|---|---|",
    ]
    for name, tps in record["median_tokens_per_s"].items():
        runs = ", ".join(f"{r['tokens_per_s']:.0f}" for r in record["runs"][name])
        lines.append(f"| {name} | {tps:.1f} | {runs} |")
    lines += ["", "| ratio | value |", "|---|---|"]
    lines += [f"| {k} | {v:.2f}x |" for k, v in record["ratios"].items()]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
