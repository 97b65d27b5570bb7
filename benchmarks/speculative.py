"""Speculative decoding for one user: greedy replies to WikiText-2 test passages on the
default model (4-bit), plain decoding against `--draft ngram`, rounds interleaved.

For each round, each passage (the first PROMPT_CHARS characters of consecutive article
chunks) is answered with OUTPUT_TOKENS greedy tokens, first plainly and then with n-gram
speculation, in one engine each (batch 1, KV cache as the artifact's). Reported: the
median tokens/s of each, the speedup, the drafted tokens kept, and whether every reply was
token for token the same (it must be).

    python benchmarks/speculative.py [--artifact OUT] [--rounds 3] [--out benchmarks/results]
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

PROMPTS, PROMPT_CHARS, OUTPUT_TOKENS = 6, 1200, 128


def passages(tokenizer) -> list[list[int]]:
    from compress.calib_data.sources import read_texts

    data = ROOT.parent / "shared" / "data" / "wikitext-2-raw" / "test.txt"
    if not data.is_file():
        raise SystemExit(f"{data} is missing: the benchmark reads WikiText-2's test split")
    text = "\n".join(read_texts(str(data)))
    step = len(text) // PROMPTS
    return [tokenizer.encode(text[i * step : i * step + PROMPT_CHARS]) for i in range(PROMPTS)]


def replies(weights, prompts, kv, draft: str | None):
    from compress.runtime.engine import Engine, Request
    from compress.runtime.sampling import SamplingParams
    from compress.runtime.speculative import make_speculator

    max_len = max(map(len, prompts)) + OUTPUT_TOKENS + 8
    spec = None if draft is None else make_speculator(draft, weights, max_len)
    engine = Engine(weights, max_batch=1, max_len=max_len, kv=kv, speculator=spec)
    params = SamplingParams(max_tokens=OUTPUT_TOKENS, ignore_eos=True)
    outputs, seconds = [], 0.0
    for prompt in prompts:
        req = engine.submit(Request(list(prompt), params))
        engine.step()  # the prompt's prefill and first token: not decode time
        t = time.perf_counter()
        while not engine.idle:
            engine.step()
        seconds += time.perf_counter() - t
        outputs.append(req.output)
    tokens = len(prompts) * (OUTPUT_TOKENS - 1)
    return outputs, tokens / seconds, spec


def w4_artifact() -> str:
    """The default model's rtn:w4g64 artifact, made once under benchmarks/work."""
    from compress.pipeline import compress
    from compress.recipe import parse_quant, parse_recipe

    artifact = str(HERE / "work" / "speculative" / "smollm2-rtn-w4g64")
    if not Path(artifact).exists():
        compress("default", parse_recipe({"stages": [parse_quant("rtn:w4g64")]}), artifact)
    return artifact


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--artifact", help="a 4-bit artifact of the default model (made if absent)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()

    from compress.model.loading import load_tokenizer, resolve
    from compress.runtime.kv_cache import KVScheme
    from compress.runtime.weights import load_weights

    ckpt = resolve(args.artifact or w4_artifact())
    weights = load_weights(ckpt, device="cpu")
    kv = KVScheme.of_artifact(ckpt.config)
    prompts = passages(load_tokenizer(ckpt))
    runs = {"plain": [], "ngram": []}
    identical, kept = True, []
    for r in range(args.rounds):
        plain, plain_tps, _ = replies(weights, prompts, kv, None)
        spec_out, spec_tps, spec = replies(weights, prompts, kv, "ngram")
        identical &= spec_out == plain
        runs["plain"].append(plain_tps)
        runs["ngram"].append(spec_tps)
        kept.append(spec.acceptance)
        same = spec_out == plain
        print(f"round {r}: plain {plain_tps:.1f} tok/s, ngram {spec_tps:.1f} tok/s, "
              f"{100 * spec.acceptance:.0f}% of drafts kept, identical {same}")  # fmt: skip
    medians = {k: statistics.median(v) for k, v in runs.items()}
    record = {
        "command": "python benchmarks/speculative.py",
        "artifact": "default model, rtn:w4g64" if args.artifact is None else args.artifact,
        "prompts": PROMPTS,
        "prompt_tokens": [len(p) for p in prompts],
        "output_tokens": OUTPUT_TOKENS,
        "runs_tok_s": {k: [round(x, 1) for x in v] for k, v in runs.items()},
        "median_tok_s": medians,
        "speedup": medians["ngram"] / medians["plain"],
        "acceptance": statistics.median(kept),
        "greedy_identical": identical,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "speculative.json").write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps({k: record[k] for k in ("median_tok_s", "speedup", "acceptance",
                                             "greedy_identical")}, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
