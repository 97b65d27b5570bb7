"""Latent attention's KV cache, cached as the latent (this checkout) against every head's
k and v (the expanded form of an earlier revision): cache bytes per token, and batch-1
decode tokens/s, time to first token and peak memory of `llmpress bench` as the context
grows, in interleaved rounds.

One checkpoint of random bf16 weights at a published model's widths (latent_scale.py's
shapes, GLM-4.7-Flash's by default, at a reduced depth), compressed once with
`--quant rtn:w4g64`; the artifact is the same file for both revisions, only the runtime
differs. Each `llmpress bench --batch 1 --prompt-len P --output-len N --kv KV` runs in its
own process (scale.py's measure), the baseline's from a git worktree of --baseline.
With `--llama-cpp BIN` (GLM-4.7-Flash's shape: llama.cpp's loader takes V2-Lite's only at
its own depth), llama.cpp's own converter and Q4_0 of the same checkpoint join each
round: `llama-bench -t 2 -p 0 -n 64 -d P`, 64 tokens decoded after P in its cache (its
default, 16-bit; it caches the latent too).

    python benchmarks/latent_cache.py [--shape glm-4.7-flash|deepseek-v2-lite]
        [--contexts 128,1024,4096] [--baseline 491f7aa] [--kv int8] [--rounds 3]
        [--llama-cpp BIN]

Quality figures of random weights mean nothing and are left out.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from batched_decode import cpu_flags  # noqa: E402
from latent_scale import SHAPES, llama_cpp_build, llama_cpp_q4_0  # noqa: E402
from random_checkpoint import write_config  # noqa: E402
from scale import compress, measure  # noqa: E402


def bench(root: Path, artifact: Path, context: int, output: int, kv: str, logs: Path, tag: str):
    """One `llmpress bench` of the checkout at `root`: its figures and peak RSS."""
    out = logs / f"bench-{tag}-{context}.json"
    cmd = [sys.executable, "-m", "compress", "bench", str(artifact), "--batch", "1",
           "--prompt-len", str(context), "--output-len", str(output), "--kv", kv,
           "--json", str(out)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(root)}
    row = measure(cmd, logs / f"bench-{tag}-{context}.log", env=env, cwd=root)
    record = json.loads(out.read_text())
    result = record["results"][0]
    return {
        "tok_s": round(result["tokens_per_s"], 1),
        "ttft_s": round(result["ttft_s"], 2),
        "mbu": round(result["mbu"], 3),
        "mb_per_step": round(result["bytes_per_step"] / 1e6, 1),
        "kv_bytes_per_token": record["kv_bytes_per_token"],
        "peak_rss_gb": row["peak_rss_gb"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=list(SHAPES), default="glm-4.7-flash")
    ap.add_argument("--layers", type=int, default=4, help="depth (the first one dense)")
    ap.add_argument("--contexts", default="128,1024,4096", help="prompt tokens before decoding")
    ap.add_argument("--output", type=int, default=64, help="tokens decoded after the prompt")
    ap.add_argument("--kv", default="int8", help="the cache (int8: the default)")
    ap.add_argument("--baseline", default="491f7aa", help="a revision with the expanded cache")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work", type=Path, default=HERE / "work" / "latent_cache")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--name", default="latent_cache")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--llama-cpp", type=Path, help="folder with llama-bench and llama-quantize")
    args = ap.parse_args()
    from compress.model.default import convert_gguf, default_gguf

    shutil.rmtree(args.work, ignore_errors=True)
    logs = args.work / "logs"
    logs.mkdir(parents=True)
    config = {**SHAPES[args.shape], "num_hidden_layers": args.layers, "first_k_dense_replace": 1}
    if args.shape == "glm-4.7-flash":
        config["mlp_layer_types"] = ["dense"] + ["sparse"] * (args.layers - 1)
    src = write_config(config, args.work / "src", convert_gguf(default_gguf()))
    art = args.work / "w4-rtn"
    compress(src, art, "rtn", 0, 0, logs)
    base = args.work / "baseline"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(base),
                    args.baseline], check=True)  # fmt: skip
    contexts = [int(c) for c in args.contexts.split(",")]
    checkouts = {"latent": ROOT, "expanded": base}
    runs = {tag: {c: [] for c in contexts} for tag in checkouts}
    gguf = llama_cpp_q4_0(args.llama_cpp, src, args.work) if args.llama_cpp else None
    anchor = {c: [] for c in contexts}
    try:
        for r in range(args.rounds):
            for c in contexts:
                for tag, root in checkouts.items():
                    row = bench(root, art, c, args.output, args.kv, logs, tag)
                    runs[tag][c].append(row)
                    print(f"round {r + 1} context {c} {tag}: {row}", flush=True)
                if gguf:
                    from families import llama_bench

                    anchor[c].append(round(llama_bench(args.llama_cpp, gguf, depth=c), 1))
                    print(f"round {r + 1} context {c} llama.cpp: {anchor[c][-1]}", flush=True)
                latent, expanded = (runs[t][c][-1]["kv_bytes_per_token"] for t in checkouts)
                if latent >= expanded:  # (the two checkouts ran the same code)
                    raise SystemExit(f"the baseline's cache is not larger: {runs}")
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)])
    table = []
    for c in contexts:
        row = {"context": c}
        for tag in checkouts:
            rows = runs[tag][c]
            row[tag] = {
                "tok_s": statistics.median(x["tok_s"] for x in rows),
                "ttft_s": statistics.median(x["ttft_s"] for x in rows),
                "mbu": statistics.median(x["mbu"] for x in rows),
                "mb_per_step": rows[0]["mb_per_step"],
                "kv_bytes_per_token": rows[0]["kv_bytes_per_token"],
                "peak_rss_gb": max(x["peak_rss_gb"] for x in rows),
            }
        pairs = zip(runs["latent"][c], runs["expanded"][c], strict=True)
        ratios = [a["tok_s"] / b["tok_s"] for a, b in pairs]
        row["speed_ratios"] = [round(x, 2) for x in ratios]
        row["speed_ratio"] = round(statistics.median(ratios), 2)
        if gguf:
            ours = [x["tok_s"] for x in runs["latent"][c]]
            row["llama_cpp"] = {
                "tok_s": anchor[c],
                "median_tok_s": statistics.median(anchor[c]),
                "ratios": [round(a / b, 2) for a, b in zip(ours, anchor[c], strict=True)],
            }
        table.append(row)
    record = {
        "command": "python benchmarks/latent_cache.py"
        + (f" --shape {args.shape}" if args.shape != "glm-4.7-flash" else "")
        + (f" --contexts {args.contexts}" if args.contexts != "128,1024,4096" else "")
        + (f" --kv {args.kv}" if args.kv != "int8" else "")
        + (" --llama-cpp BIN" if gguf else "")
        + (f" --name {args.name}" if args.name != "latent_cache" else ""),
        "cpu": cpu_flags(),
        "shape": args.shape,
        "layers": args.layers,
        "kv": args.kv,
        "output": args.output,
        "baseline": args.baseline,
        "rounds": args.rounds,
        "table": table,
        "llama_cpp": None
        if not gguf
        else {
            "build": llama_cpp_build(),
            "bench": "llama-bench -t 2 -p 0 -n 64 -d P -r 1 (Q4_0, its 16-bit cache)",
        },
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(record, indent=1) + "\n")
    if not args.keep:
        shutil.rmtree(args.work)


if __name__ == "__main__":
    main()
