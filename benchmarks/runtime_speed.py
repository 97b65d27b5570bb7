"""The runtime's speed against llama.cpp on this machine, one run, rounds interleaved.

The artifact is the issue's: `llmpress compress default --quant rtn:w4g64 --lm-head w8`;
beside it the original fp32 weights, dense. Each round runs, in turn:
- decode at batch 1, 8 and 32 (32-token prompts, `--output-len` tokens, greedy), w4 and fp32;
- a 512-token prompt through the serving path (packed int8-activation kernels, the reply's
  logits) and as served prompts ran before (weights dequantized to fp32, every position's
  logits);
- batch 8 with 1024-token prompts on the fp32, int8 and int4 KV caches (first
  `--long-rounds` rounds);
- llama.cpp, when `--llama-cpp` names a folder with its `llama-bench` and
  `llama-batched-bench`: prompt 512 and decode at batch 1 (llama-bench), and decode at
  batch 1, 8 and 32 after 32-token prompts (llama-batched-bench), on `--gguf` with the
  same thread count.
Figures are medians over rounds; ratios are of medians from this run. The memory bandwidth
and fp32 matmul rate are medians of repeats measured before and after.

    python benchmarks/runtime_speed.py --llama-cpp PATH/TO/llama.cpp/build/bin \
        --gguf model-q4_0.gguf [--rounds 5] [--long-rounds 3] [--out benchmarks/results] \
        [--name runtime_speed]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch
from batched_decode import cpu_flags
from llama_server import add_cflags_argument

from compress.kernels.cpu import set_threads
from compress.model.loading import resolve
from compress.pipeline import compress
from compress.recipe import parse_recipe
from compress.runtime.bench import bench_one, measure_ceilings
from compress.runtime.kv_cache import KVCache, parse_kv
from compress.runtime.model import Model
from compress.runtime.weights import load_weights

HERE = Path(__file__).resolve().parent


def prefill_seconds(weights, tokens: int, before: bool) -> float:
    """Time to first token of one `tokens`-long prompt. `before`: as served prompts ran
    before issue 14 (weights dequantized to fp32, logits at every position)."""
    s = weights.shape
    model = Model(weights, tokens + 2, exact=before)
    cache = KVCache(s.layers, 1, s.kv_heads, tokens + 1, s.head_dim)
    ids = torch.randint(s.vocab, (tokens,), generator=torch.Generator().manual_seed(tokens))
    t = time.perf_counter()
    model.prefill(ids, cache, 0, last_only=not before)
    return time.perf_counter() - t


def llama_bench(bin_dir: Path, gguf: Path, threads: int, output_len: int) -> dict:
    run = subprocess.run(
        [str(bin_dir / "llama-bench"), "-m", str(gguf), "-t", str(threads), "-p", "512",
         "-n", str(output_len), "-r", "1", "-o", "json"],
        capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip
    rows = json.loads(run.stdout)
    pp = next(r for r in rows if r["n_prompt"] == 512)
    tg = next(r for r in rows if r["n_gen"] == output_len)
    return {"prefill_512_tok_s": pp["avg_ts"], "batch_1_tok_s": tg["avg_ts"]}


def llama_batched(bin_dir: Path, gguf: Path, threads: int, output_len: int) -> dict:
    """Decode tok/s of llama-batched-bench at batch 1, 8, 32 (32-token prompts)."""
    run = subprocess.run(
        [str(bin_dir / "llama-batched-bench"), "-m", str(gguf), "-t", str(threads),
         "-c", str(32 * (32 + output_len)), "-b", "2048", "-ub", "512", "-npp", "32",
         "-ntg", str(output_len), "-npl", "1,8,32", "--output-format", "jsonl"],
        capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip
    out = {}
    for line in run.stdout.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            out[f"batch_{r['pl']}_tok_s"] = r["speed_tg"]
    return out


def llama_version(bin_dir: Path) -> str:
    run = subprocess.run([str(bin_dir / "llama-bench"), "--version"], capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    return " ".join((run.stdout + run.stderr).split())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--long-rounds", type=int, default=3)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--llama-cpp", type=Path, help="folder with llama-bench, llama-batched-bench")
    ap.add_argument("--gguf", type=Path, help="the GGUF llama.cpp runs (e.g. Q4_0)")
    add_cflags_argument(ap)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--name", default="runtime_speed", help="the results' file name")
    args = ap.parse_args()
    threads = torch.get_num_threads()
    set_threads(threads)
    before = measure_ceilings()
    print(f"{cpu_flags()}; {threads} threads", flush=True)
    bw, fl = statistics.median(before["bandwidth"]), statistics.median(before["matmul"])
    print(f"bandwidth {bw / 1e9:.1f} GB/s, fp32 matmul {fl / 1e9:.0f} GFLOP/s", flush=True)
    runs: dict[str, list] = {}

    def note(name: str, value: float, unit: str) -> None:
        runs.setdefault(name, []).append(value)
        print(f"  {name}: {value:.1f} {unit}", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "w4g64"
        recipe = parse_recipe({"stages": [{"rtn": {"bits": 4, "group_size": 64}}], "lm_head": "w8"})
        compress("default", recipe, out, log=lambda _: None)
        models = {"w4": load_weights(resolve(str(out))), "fp32": load_weights(resolve("default"))}
        for r in range(max(args.rounds, args.long_rounds)):
            print(f"round {r + 1}", flush=True)
            if r < args.rounds:
                for name, w in models.items():
                    for b in (1, 8, 32):
                        res = bench_one(w, b, 32, args.output_len, bw, fl)
                        note(f"{name} batch {b}", res.tokens_per_s, "tok/s")
                        if b == 1:
                            note(f"{name} batch 1 MBU %", 100 * res.mbu, "%")
                for old in (True, False):
                    path = "before (exact, all logits)" if old else "packed"
                    tok_s = 512 / prefill_seconds(models["w4"], 512, old)
                    note(f"w4 prompt 512 {path}", tok_s, "prompt tok/s")
                if args.llama_cpp:
                    lb = llama_bench(args.llama_cpp, args.gguf, threads, args.output_len)
                    lb |= llama_batched(args.llama_cpp, args.gguf, threads, args.output_len)
                    for k, v in lb.items():
                        note(f"llama.cpp {k}", v, "tok/s")
            if r < args.long_rounds:
                for kv in ("none", "int8", "int4"):
                    res = bench_one(models["w4"], 8, 1024, args.output_len, bw, fl, parse_kv(kv))
                    note(f"w4 batch 8 prompt 1024 {kv} KV", res.tokens_per_s, "tok/s")
        params = sum(lin.out_features * lin.in_features for lin in models["w4"].linears())
    after = measure_ceilings()
    record = summarize(args, runs, before, after, params, threads)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(record, indent=2) + "\n")
    (args.out / f"{args.name}.md").write_text(table(record) + "\n")
    print(table(record))


def summarize(args, runs, before, after, params, threads) -> dict:
    med = {k: statistics.median(v) for k, v in runs.items()}
    matmul = statistics.median(before["matmul"] + after["matmul"])
    ratios = {
        "w4 batch 8 / batch 1": med["w4 batch 8"] / med["w4 batch 1"],
        "w4 batch 32 / batch 1": med["w4 batch 32"] / med["w4 batch 1"],
        "w4 batch 32 GFLOP/s / fp32 matmul rate": 2 * params * med["w4 batch 32"] / matmul,
        "int8 KV / fp32 KV, batch 8, prompt 1024": med["w4 batch 8 prompt 1024 int8 KV"]
        / med["w4 batch 8 prompt 1024 none KV"],
        "int4 KV / fp32 KV, batch 8, prompt 1024": med["w4 batch 8 prompt 1024 int4 KV"]
        / med["w4 batch 8 prompt 1024 none KV"],
        "prompt 512: packed / before": med["w4 prompt 512 packed"]
        / med["w4 prompt 512 before (exact, all logits)"],
    }
    if "llama.cpp prefill_512_tok_s" in med:
        ratios["prompt 512: llmpress / llama.cpp"] = (
            med["w4 prompt 512 packed"] / med["llama.cpp prefill_512_tok_s"]
        )
        for b in (1, 8, 32):
            ratios[f"batch {b}: llmpress w4 / llama.cpp"] = (
                med[f"w4 batch {b}"] / med[f"llama.cpp batch_{b}_tok_s"]
            )
    return {
        "benchmark": "runtime_speed",
        "cpu": cpu_flags(),
        "threads": threads,
        "output_len": args.output_len,
        "rounds": args.rounds,
        "long_rounds": args.long_rounds,
        "llama_cpp": {
            "gguf": args.gguf.name,
            "version": llama_version(args.llama_cpp),
        }
        if args.llama_cpp
        else None,
        "llama_cflags": args.llama_cflags if args.llama_cpp else None,
        "ceilings": {
            "bandwidth_bytes_per_s": statistics.median(before["bandwidth"] + after["bandwidth"]),
            "matmul_flops": matmul,
            "samples": {"before": before, "after": after},
        },
        "linear_params": params,
        "runs": runs,
        "medians": med,
        "ratios": ratios,
    }


def table(record: dict) -> str:
    c = record["ceilings"]
    lines = [
        f"CPU: {record['cpu']}; {record['threads']} threads. Ceilings (medians before and "
        f"after): memory read {c['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s, fp32 matmul "
        f"{c['matmul_flops'] / 1e9:.0f} GFLOP/s. Medians of {record['rounds']} rounds "
        f"({record['long_rounds']} for 1024-token prompts).",
        "",
        "| measurement | median | runs |",
        "|---|---|---|",
    ]
    for name, runs in record["runs"].items():
        vals = ", ".join(f"{v:.1f}" for v in runs)
        lines.append(f"| {name} | {record['medians'][name]:.1f} | {vals} |")
    lines += ["", "| ratio (of medians) | value |", "|---|---|"]
    lines += [f"| {k} | {v:.2f} |" for k, v in record["ratios"].items()]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
