"""The default KV cache, measured: KIVI int8 against fp32 on the README's artifact, for
speed at every batch size and at short and long contexts, and for drift as `eval` reports
it (as served and weights only) with the time `eval` takes.

Speed: `bench`'s decode tokens/s (64 tokens out) at batch 1, 8 and 32 with 32-token
prompts and at batch 1 and 8 with 1,024-token prompts; each round runs every case with
both caches, one after the other, and the ratios are medians of the rounds' ratios (this
shared machine drifts within minutes). Drift: `llmpress eval` of the same artifact on
WikiText-2 test (512-token windows) with `--kv none`, `--kv int8` and without `--kv` (the
default: the served pass runs the artifact's int8 cache, the weights-alone pass an fp32
one), the original's figures computed once and then read from eval's cache, so each timed
eval costs only the artifact; two rounds, alternating.

    python benchmarks/kv_default.py [--rounds 3] [--windows 16] [--name kv_default]

`--windows 0` skips the eval. With LLMPRESS_KERNEL_FLAGS set (e.g. "-O3 -mavx2 -mfma
-mf16c -fopenmp") the kernels are built for that instruction set, and the record says so.

Reads WikiText-2 test from ../shared/data (fails when it is missing).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from compress.eval.run import evaluate
from compress.kernels.cpu import set_threads
from compress.model.loading import resolve
from compress.pipeline import compress
from compress.recipe import recipe_from_flags
from compress.runtime.bench import bench_one, measure_bandwidth, measure_matmul_flops
from compress.runtime.kv_cache import KVCache, parse_kv
from compress.runtime.weights import load_weights

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from batched_decode import cpu_flags  # noqa: E402
from eval_cache import shared_cache  # noqa: E402

DATA = HERE.parent.parent / "shared" / "data" / "wikitext-2-raw" / "test.txt"
CASES = [(1, 32), (8, 32), (32, 32), (1, 1024), (8, 1024)]  # (batch, prompt tokens)
KINDS = ("none", "int8")
EVAL_KV = {"none": "none", "int8": "int8", "default": None}  # record key: eval's kv


def speed(weights, rounds: int, output_len: int) -> list[dict]:
    """Decode tok/s per case and cache kind, rounds interleaved; ratio int8 / fp32."""
    bw, fl = measure_bandwidth(), measure_matmul_flops()
    runs = {(b, p, kv): [] for b, p in CASES for kv in KINDS}
    for r in range(rounds):
        for b, p in CASES:
            for kv in KINDS:
                res = bench_one(weights, b, p, output_len, bw, fl, parse_kv(kv))
                runs[(b, p, kv)].append(res.tokens_per_s)
                print(f"round {r + 1} batch {b} prompt {p} {kv}: {res.tokens_per_s:.1f} tok/s",
                      flush=True)  # fmt: skip
    rows = []
    for b, p in CASES:
        fp32, int8 = runs[(b, p, "none")], runs[(b, p, "int8")]
        rows.append({
            "batch": b,
            "prompt": p,
            "fp32_tok_s": [round(x, 1) for x in fp32],
            "int8_tok_s": [round(x, 1) for x in int8],
            "int8 / fp32 (median of rounds)": round(
                statistics.median(y / x for x, y in zip(fp32, int8, strict=True)), 3
            ),
        })  # fmt: skip
    return rows


def drift(artifact: Path, windows: int, rounds: int) -> dict:
    """eval's figures and wall time per cache kind (the original's figures cached first)."""
    quiet = lambda *_: None  # noqa: E731
    evaluate(str(artifact), data=str(DATA), windows=windows, record=False, log=quiet, kv="none")
    out = {name: {"seconds": []} for name in EVAL_KV}
    for _ in range(rounds):
        for name, kv in EVAL_KV.items():
            t = time.perf_counter()
            d = evaluate(str(artifact), data=str(DATA), windows=windows, record=False,
                         log=quiet, kv=kv)  # fmt: skip
            out[name]["seconds"].append(round(time.perf_counter() - t, 1))
            out[name].update({
                "served": {"kl": d.kl, "ppl": d.ppl, "top1": d.top1},
                "weights_only": {k: d.weights_only[k] for k in ("kl", "ppl", "top1")},
                "reference": d.reference,
                "tokens": d.tokens,
            })  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--windows", type=int, default=16)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--name", default="kv_default", help="the results' file name")
    args = ap.parse_args()
    if not DATA.is_file():
        raise SystemExit(f"{DATA} is missing: the benchmark evaluates on WikiText-2's test split")
    set_threads(torch.get_num_threads())
    with tempfile.TemporaryDirectory() as tmp:
        shared_cache(Path(tmp) / "cache")  # the converted model linked; eval's entries its own
        os.environ["LLMPRESS_CACHE"] = str(Path(tmp) / "cache")
        artifact = Path(tmp) / "smollm2-w4g64"
        recipe = recipe_from_flags(None, "w4g64", {}, {})  # as the README's: int8 KV
        compress("default", recipe, artifact, log=lambda _: None)
        ckpt = resolve(str(artifact))
        weights = load_weights(ckpt)
        s = weights.shape
        per_token = {
            kv: KVCache(s.layers, 1, s.kv_heads, 64, s.head_dim, parse_kv(kv)).bytes_per_token()
            for kv in KINDS
        }
        rows = speed(weights, args.rounds, args.output_len)
        del weights
        evals = drift(artifact, args.windows, 2) if args.windows else None
    flags = os.environ.get("LLMPRESS_KERNEL_FLAGS")
    record = {
        "benchmark": "kv_default",
        "command": (f'LLMPRESS_KERNEL_FLAGS="{flags}" ' if flags else "")
        + "python benchmarks/kv_default.py"
        + ("" if args.rounds == 3 else f" --rounds {args.rounds}")
        + ("" if args.windows == 16 else f" --windows {args.windows}")
        + ("" if args.name == "kv_default" else f" --name {args.name}"),
        "artifact": "llmpress compress default --quant w4g64",  # the README's: int8 KV cache
        "cpu": cpu_flags(),
        "threads": torch.get_num_threads(),
        "output_len": args.output_len,
        "kv_bytes_per_token": per_token,
        "speed": rows,
        "kernel_flags": flags,
    }
    if evals:
        record["eval"] = {
            "windows": args.windows,
            "ctx": 512,
            "data": "wikitext-2-raw test",
            **evals,
        }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(record, indent=1) + "\n")
    for row in rows:
        print(row)
    print(json.dumps(record.get("eval"), indent=1))


if __name__ == "__main__":
    main()
