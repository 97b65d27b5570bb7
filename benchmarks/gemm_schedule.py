"""How the packed GEMMs share their columns between threads, on a quiet CPU and on one
another process keeps taking a core from.

A prefill step splits its columns either in fixed halves (static) or in chunks that
threads take as they come (dynamic). On these 2-core machines a server's request
handlers and clients, or any other process, take a core away for moments: with fixed
halves the other thread then finishes its half and waits at the barrier. `competitor`
runs a second process busy BUSY_MS then asleep IDLE_MS (about a fifth of one core, in
bursts), standing in for a server's handlers and clients while 32 requests arrive.

One engine, serve_load's artifact (the default model, rtn:w4g64zp, lm_head w8):
- prefill: one step of 13 prompts of about 20 tokens (serve_load's prompts, cut at a
  budget of 256 tokens), as 32 clients' arrivals are prefilled;
- decode: one step at batch 8 and at batch 32, averaged over 24 steps.
Each is timed with the GEMMs handing out chunks from M rows up (`gemm_dynamic_rows`):
64 (the default: prefill dynamic, decode static), never (all static) and, for decode, 1
(all dynamic). The arms take turns ABBA for `--rounds` pairs; medians. Then a server of the
same artifact, 32 streaming clients in a process of their own (serve_load's), the first
two settings taking turns ABBA for `--rounds` pairs: what the prefill steps' gain is
worth to a served round.

    python benchmarks/gemm_schedule.py [--rounds 12]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from batched_decode import cpu_flags  # noqa: E402
from serve_load import load_row, run_clients  # noqa: E402

from compress.kernels.cpu import gemm_dynamic_rows, set_threads  # noqa: E402
from compress.model.loading import load_tokenizer, resolve  # noqa: E402
from compress.pipeline import compress  # noqa: E402
from compress.recipe import parse_quant, parse_recipe  # noqa: E402
from compress.runtime.engine import Engine, Request  # noqa: E402
from compress.runtime.sampling import SamplingParams  # noqa: E402
from compress.runtime.weights import load_weights  # noqa: E402
from compress.serve.app import build_app  # noqa: E402
from compress.serve.server import make_server  # noqa: E402

PROMPT = "The history of the city begins in the early middle ages, when a small settlement"
BUSY_MS, IDLE_MS = 0.3, 1.0
NEVER = 1 << 30
ARMS = {"prefill": {"64": 64, "never": NEVER}, "decode": {"64": 64, "never": NEVER, "1": 1}}
COMPETITOR = f"""
import time
while True:
    t = time.perf_counter()
    while time.perf_counter() - t < {BUSY_MS / 1e3}:
        pass
    time.sleep({IDLE_MS / 1e3})
"""


def prefill_s(engine: Engine, prompts: list[list[int]]) -> float:
    """One prefill step of every prompt (each asks one token), timed; then drained."""
    for p in prompts:
        engine.submit(Request(p, SamplingParams(max_tokens=1, ignore_eos=True)))
    t = time.perf_counter()
    engine.prefill_step()
    seconds = time.perf_counter() - t
    while not engine.idle:
        engine.step()
    return seconds


def decode_s(engine: Engine, prompts: list[list[int]], steps: int = 24) -> float:
    """Seconds per decode step of len(prompts) sequences, after their prefill."""
    for p in prompts:
        engine.submit(Request(p, SamplingParams(max_tokens=steps + 2, ignore_eos=True)))
    engine.step()
    engine.step()
    t, n = time.perf_counter(), 0
    while not engine.idle:
        engine.step()
        n += 1
    return (time.perf_counter() - t) / n


def abba(arms: dict[str, int], run, rounds: int) -> dict:
    """Each arm's median seconds, the arms taking turns ABBA (C... for more)."""
    names, seconds = list(arms), {a: [] for a in arms}
    run()  # warm
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            gemm_dynamic_rows(arms[name])
            seconds[name].append(run())
    gemm_dynamic_rows(64)
    return {a: {"median_s": statistics.median(v), "runs_s": v} for a, v in seconds.items()}


def served_rounds(art: Path, rounds: int) -> dict:
    """32 streaming clients (serve_load's, in a process of their own) against one server,
    the two settings taking turns ABBA: each one's median output tokens/s, the median of
    the pairs' ratios (fixed halves over the default) and how many pairs the default won."""
    app = build_app(str(art), max_batch=32, max_len=256, max_queue=32)
    httpd = make_server(app, "127.0.0.1", 0)
    port = httpd.server_address[1]
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    tok_s = {"64": [], "never": []}
    with multiprocessing.get_context("spawn").Pool(1) as clients:
        clients.apply(run_clients, (port, 1, 8, 60))  # warm-up
        for r in range(rounds):
            for name in ("64", "never") if r % 2 == 0 else ("never", "64"):
                gemm_dynamic_rows(ARMS["prefill"][name])
                out, wall, hung = clients.apply(run_clients, (port, 32, 64, 120))
                tok_s[name].append(load_row(32, 32, out, wall, hung)["output_tokens_per_s"])
    gemm_dynamic_rows(64)
    httpd.shutdown()
    httpd.server_close()
    app.scheduler.stop()
    ratios = [b / a for a, b in zip(tok_s["64"], tok_s["never"], strict=True)]
    return {
        "streams": 32,
        "tok_s": {k: statistics.median(v) for k, v in tok_s.items()},
        "runs_tok_s": tok_s,
        "never_over_default": statistics.median(ratios),
        "default_won": sum(x < 1 for x in ratios),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "gemm_schedule.json")
    args = ap.parse_args()
    set_threads(torch.get_num_threads())
    tmp = tempfile.TemporaryDirectory()
    art = Path(tmp.name) / "w4"
    recipe = parse_recipe({"stages": [parse_quant("rtn:w4g64zp")], "lm_head": "w8"})
    compress("default", recipe, art, log=lambda _: None)
    ckpt = resolve(str(art))
    weights, tok = load_weights(ckpt), load_tokenizer(ckpt)
    prompts = [tok.encode(f"Note {i}: {PROMPT}") for i in range(32)]
    prefill_engine = Engine(weights, max_batch=32, max_len=256, prefill_tokens=256)
    decode = {b: Engine(weights, max_batch=b, max_len=256) for b in (8, 32)}
    rows = []
    for condition in ("quiet", "competitor"):
        other = None
        if condition == "competitor":
            other = subprocess.Popen([sys.executable, "-c", COMPETITOR])
            time.sleep(0.5)
        try:
            rows13 = min(sum(map(len, prompts[:13])), prefill_engine.prefill_tokens)
            work = [("prefill", rows13, lambda: prefill_s(prefill_engine, prompts[:13]))]
            work += [("decode", b, lambda b=b: decode_s(decode[b], prompts[:b])) for b in decode]
            for kind, size, run in work:
                arms = abba(ARMS[kind], run, args.rounds)
                base = arms["never"]["median_s"]
                ratios = {a: base / v["median_s"] for a, v in arms.items()}
                row = {"condition": condition, "work": kind, "rows": size, "arms": arms}
                row["never_over"] = ratios
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "arms"}), flush=True)
        finally:
            if other is not None:
                other.kill()
                other.wait()
    served = served_rounds(art, args.rounds)
    print(json.dumps(served), flush=True)
    tmp.cleanup()
    record = {
        "benchmark": "gemm_schedule",
        "machine": {
            "platform": platform.platform(),
            "cpu": cpu_flags(),
            "threads": torch.get_num_threads(),
        },
        "rounds": args.rounds,
        "competitor": {"busy_ms": BUSY_MS, "idle_ms": IDLE_MS},
        "prefill_prompts": 13,
        "rows": rows,
        "served": served,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
