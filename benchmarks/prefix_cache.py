"""A shared system prompt through `llmpress serve`, with the prefix cache on (the default)
and off, rounds interleaved.

Workload: 32 requests arrive together; each is the same 1,024-token system prompt (the
first 1,024 tokens of WikiText-2's test split) followed by 32 tokens of its own (32
different places further on), 16 tokens out, greedy, sent as token ids to
/v1/completions. The server runs the default model at w4 (RTN g64 zero point, lm_head
int8) with `serve`'s defaults (8 sequences, 192 prompt tokens a step). Reported per
setting: wall time, requests/s, the median request's latency (whole reply), prompt
tokens computed (the server's `prompt_tokens_total` less
`prefix_cache_hit_tokens_total`; with the cache off every prompt token), and how many
replies equal those of the first cache-off run (requests arriving together are prefilled
in chunks cut differently from run to run, and a chunk boundary moves logits by float
rounding: a near-tie can then go the other way, with the cache off too).

With `--llama-server BIN --gguf Q4_0.gguf`, llama.cpp's own server (native build, its
defaults, prompt cache on, but `-fa off`: its flash attention, on by default, took 57 s
against 43 s for this workload here; `-np 8 -c 16384 -t 2 -tb 2`, the same 8 sequences of
2,048 tokens) takes the same 32 requests in each round, right after llmpress's runs; its prompt
tokens computed are the sum of its replies' `timings.prompt_n` (tokens not taken from its
cache).

    python benchmarks/prefix_cache.py [--rounds 2] [--requests 32] [--out benchmarks/results]
        [--llama-server PATH/TO/llama.cpp/build/bin --gguf model-q4_0.gguf]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from batched_decode import cpu_flags
from llama_server import add_arguments, check_arguments, llama_server, version

from compress.calib_data.sources import read_texts
from compress.kernels.cpu import set_threads
from compress.model.loading import load_tokenizer, resolve
from compress.pipeline import compress
from compress.recipe import parse_quant, parse_recipe
from compress.serve.app import build_app
from compress.serve.server import make_server

HERE = Path(__file__).resolve().parent
DATA = HERE.parent.parent / "shared" / "data" / "wikitext-2-raw" / "test.txt"
SYSTEM, UNIQUE, OUT = 1024, 32, 16


def prompts(artifact: Path, n: int) -> list[list[int]]:
    if not DATA.exists():
        raise SystemExit(f"{DATA} is missing: this benchmark reads WikiText-2 beside the repo")
    tok = load_tokenizer(resolve(str(artifact)))
    ids = tok("\n".join(read_texts(str(DATA))[:2000]), add_special_tokens=False).input_ids
    system = ids[:SYSTEM]
    return [
        system + ids[SYSTEM + 200 * (i + 1) : SYSTEM + 200 * (i + 1) + UNIQUE] for i in range(n)
    ]


def post(port: int, prompt: list[int], out: dict, i: int) -> None:
    """One request; out[i] = (text, seconds, prompt tokens computed as llama-server says)."""
    body = json.dumps({"prompt": prompt, "max_tokens": OUT, "temperature": 0}).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions", body, {"Content-Type": "application/json"}
    )
    t0 = time.perf_counter()
    reply = json.loads(urllib.request.urlopen(req, timeout=1800).read())
    computed = reply.get("timings", {}).get("prompt_n")
    out[i] = (reply["choices"][0]["text"], time.perf_counter() - t0, computed)


def send_all(port: int, batch: list[list[int]]) -> tuple[dict, float]:
    """Every prompt at once, a thread each; the replies and the wall time."""
    out: dict[int, tuple] = {}
    threads = [threading.Thread(target=post, args=(port, p, out, i)) for i, p in enumerate(batch)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out, time.perf_counter() - t0


def row(name: str, batch: list[list[int]], out: dict, wall: float, computed: float) -> dict:
    return {
        "prefix_cache": name,
        "wall_s": wall,
        "requests_per_s": len(batch) / wall,
        "latency_p50_s": statistics.median(out[i][1] for i in range(len(batch))),
        "prompt_tokens": sum(map(len, batch)),
        "prompt_tokens_computed": computed,
        "replies": [out[i][0] for i in range(len(batch))],
    }


def metrics(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {
        ln.split()[0]: float(ln.split()[1])
        for ln in text.splitlines()
        if ln.startswith("llmpress_") and " " in ln
    }


def run(artifact: Path, batch: list[list[int]], cache_mb: int | None) -> dict:
    app = build_app(
        str(artifact), max_batch=8, max_len=2048, max_queue=64, prefix_cache_mb=cache_mb
    )
    server = make_server(app, "127.0.0.1", 0)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        out, wall = send_all(port, batch)
        m = metrics(port)
    finally:
        server.shutdown()
        server.server_close()
        app.scheduler.stop()
    hits = m.get("llmpress_prefix_cache_hit_tokens_total", 0.0)
    name = "off" if cache_mb == 0 else "on"
    return row(name, batch, out, wall, sum(map(len, batch)) - hits)


def run_llama(bin_dir: Path, gguf: Path, batch: list[list[int]]) -> dict:
    """llama-server, its prompt cache on (its default) and flash attention off (faster
    here), after a short warm-up request."""
    with llama_server(bin_dir, gguf, 8, 8 * 2048, "-fa", "off") as port:
        post(port, batch[0][-UNIQUE:], {}, 0)  # shares no block with the workload
        out, wall = send_all(port, batch)
    return row("llama-server", batch, out, wall, sum(out[i][2] for i in range(len(batch))))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    add_arguments(ap)
    args = ap.parse_args()
    check_arguments(args)
    set_threads(torch.get_num_threads())
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        art = Path(tmp) / "w4"
        recipe = parse_recipe({"stages": [parse_quant("rtn:w4g64zp")], "lm_head": "w8"})
        compress("default", recipe, art, log=lambda _: None)
        batch = prompts(art, args.requests)
        for r in range(args.rounds):
            for cache_mb in (None, 0, "llama-server") if args.llama_server else (None, 0):
                if cache_mb == "llama-server":
                    done = run_llama(args.llama_server, args.gguf, batch)
                else:
                    done = run(art, batch, cache_mb)
                done["round"] = r
                runs.append(done)
                print({k: v for k, v in done.items() if k != "replies"}, flush=True)
    first = next(r for r in runs if r["prefix_cache"] == "off")["replies"]
    for r in runs:  # concurrent arrivals cut prompts into chunks differently from run to run
        r["replies_equal"] = sum(a == b for a, b in zip(r["replies"], first, strict=True))
    summary = {}
    for name in ("on", "off", "llama-server")[: 3 if args.llama_server else 2]:
        rows = [r for r in runs if r["prefix_cache"] == name]
        summary[name] = {
            "requests_per_s": statistics.median(r["requests_per_s"] for r in rows),
            "wall_s": statistics.median(r["wall_s"] for r in rows),
            "latency_p50_s": statistics.median(r["latency_p50_s"] for r in rows),
            "prompt_tokens_computed": max(r["prompt_tokens_computed"] for r in rows),
            "replies_equal_first_off": [r["replies_equal"] for r in rows],
        }
    command = f"python benchmarks/prefix_cache.py --rounds {args.rounds}"
    if args.llama_server:
        command += f" --llama-server LLAMA_BIN --gguf {args.gguf.name}"
    record = {
        "command": command,
        "llama_server": None
        if not args.llama_server
        else f"{args.gguf.name} ({version(args.llama_server)}), -np 8 -c 16384 -t 2 -tb 2 -fa off",
        "cpu": cpu_flags(),
        "kv_cache": recipe.kv_cache,  # the artifact's, which serve runs
        "workload": {
            "requests": args.requests,
            "system_tokens": SYSTEM,
            "unique_tokens": UNIQUE,
            "max_tokens": OUT,
        },
        "bound_tokens": SYSTEM + args.requests * UNIQUE,
        "speedup": summary["on"]["requests_per_s"] / summary["off"]["requests_per_s"],
        "summary": summary,
        "runs": [{k: v for k, v in r.items() if k != "replies"} for r in runs],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "prefix_cache.json").write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps({k: record[k] for k in ("bound_tokens", "speedup", "summary")}, indent=2))


if __name__ == "__main__":
    main()
