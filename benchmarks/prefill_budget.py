"""The prefill token budget (`serve --prefill-tokens`): what a long prompt arriving among
running streams costs them, and what the budget costs the long prompt.

Default model, 4-bit (rtn:w4g64), fp32 KV cache, one engine per budget. Eight streams
(WikiText-2 test passages of ~60 tokens) decode; once each has its first token, a long
prompt (LONG tokens of WikiText-2 test) arrives. Until the long prompt's first token,
every engine step is timed. Reported per budget, the median over rounds interleaved:
- the streams' worst gap between two tokens while the long prompt is prefilled, and their
  steady time per token before it arrived (a whole prefill of LONG tokens stalls them
  for its full length);
- the long prompt's time to first token (chunks pay a decode step each between them);
- and on a second workload, ARRIVALS short prompts (WikiText-2 test passages of ~18
  tokens) arriving together at an idle engine: their median and last time to first token.

    python benchmarks/prefill_budget.py [--budgets 128,192,256,384,512,2048] [--rounds 3] \
        [--name prefill_budget]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

STREAMS, STREAM_CHARS, LONG = 8, 300, 1500
ARRIVALS, ARRIVAL_CHARS = 32, 80


def texts(tokenizer) -> tuple[list[list[int]], list[int]]:
    from compress.calib_data.sources import read_texts

    data = ROOT.parent / "shared" / "data" / "wikitext-2-raw" / "test.txt"
    if not data.is_file():
        raise SystemExit(f"{data} is missing: the benchmark reads WikiText-2's test split")
    text = "\n".join(read_texts(str(data)))
    step = len(text) // (STREAMS + 1)
    streams = [tokenizer.encode(text[i * step : i * step + STREAM_CHARS]) for i in range(STREAMS)]
    long = tokenizer.encode(text[STREAMS * step :])[:LONG]
    hop = len(text) // ARRIVALS
    short = [tokenizer.encode(text[i * hop : i * hop + ARRIVAL_CHARS]) for i in range(ARRIVALS)]
    return streams, long, short


def arrivals(weights, prompts, budget: int) -> dict:
    """Every prompt submitted at once to an idle engine; time to first token of each."""
    from compress.runtime.engine import Engine, Request
    from compress.runtime.sampling import SamplingParams

    engine = Engine(weights, max_batch=len(prompts), max_len=256, prefill_tokens=budget)
    engine.generate([prompts[0]], SamplingParams(max_tokens=2))  # warm
    reqs = [Request(p, SamplingParams(max_tokens=16, ignore_eos=True)) for p in prompts]
    t0 = time.perf_counter()
    for r in reqs:
        r.submitted = t0
        engine.submit(r)
    while any(r.first_token_at is None for r in reqs):
        engine.step()
    ttft = sorted(r.first_token_at - t0 for r in reqs)
    return {"arrivals_ttft_p50_s": statistics.median(ttft), "arrivals_ttft_last_s": ttft[-1]}


def one_run(weights, streams, long, budget: int) -> dict:
    from compress.runtime.engine import Engine, Request
    from compress.runtime.sampling import SamplingParams

    engine = Engine(weights, max_batch=STREAMS + 1, max_len=2048, prefill_tokens=budget)
    running = [
        engine.submit(Request(p, SamplingParams(max_tokens=400, ignore_eos=True))) for p in streams
    ]
    steady = []
    while not all(r.output for r in running):
        engine.step()
    for _ in range(8):  # steady decode of the streams alone
        t = time.perf_counter()
        engine.step()
        steady.append(time.perf_counter() - t)
    late = engine.submit(Request(long, SamplingParams(max_tokens=1, ignore_eos=True)))
    arrived, gaps = time.perf_counter(), []
    while not late.output:
        t = time.perf_counter()
        engine.step()
        gaps.append(time.perf_counter() - t)
    return {
        "steady_tpot_ms": 1e3 * statistics.median(steady),
        "worst_gap_ms": 1e3 * max(gaps),
        "long_ttft_s": time.perf_counter() - arrived,
        "steps": len(gaps),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--artifact", help="a 4-bit artifact of the default model (made if absent)")
    ap.add_argument("--budgets", default="128,192,256,384,512,2048")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--name", default="prefill_budget", help="the results' file name")
    args = ap.parse_args()

    from batched_decode import cpu_flags
    from speculative import w4_artifact

    from compress.model.loading import load_tokenizer, resolve
    from compress.runtime.weights import load_weights

    ckpt = resolve(args.artifact or w4_artifact())
    weights = load_weights(ckpt, device="cpu")
    streams, long, short = texts(load_tokenizer(ckpt))
    budgets = [int(b) for b in args.budgets.split(",")]
    runs = {b: [] for b in budgets}
    for r in range(args.rounds):
        for b in budgets:
            runs[b].append(one_run(weights, streams, long, b) | arrivals(weights, short, b))
            print(f"round {r + 1} budget {b}: {runs[b][-1]}", flush=True)
    rows = {str(b): {k: statistics.median(x[k] for x in v) for k in v[0]} for b, v in runs.items()}
    record = {
        "benchmark": "prefill_budget",
        "command": f"python benchmarks/prefill_budget.py --budgets {args.budgets} "
        f"--rounds {args.rounds}"
        + (f" --name {args.name}" if args.name != "prefill_budget" else ""),
        "cpu": cpu_flags(),
        "setup": f"default model rtn:w4g64, fp32 KV cache, {STREAMS} streams decoding, a "
        f"{len(long)}-token prompt arriving",
        "arrivals": f"{ARRIVALS} prompts of {statistics.median(map(len, short)):.0f} tokens "
        "(median) arriving together at an idle engine",
        "rows": rows,
    }
    for b, row in rows.items():
        print(b, {k: round(v, 3) for k, v in row.items()})
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
