"""Speculative decoding for one user: greedy replies on the default model (4-bit), plain
decoding against `--draft ngram` (and `--draft ARTIFACT` when given), rounds interleaved.

Two workloads of PROMPTS WikiText-2 test passages (the first PROMPT_CHARS characters of
consecutive article chunks): `continue` feeds each passage as raw text to be continued;
`summarise` asks for a summary of it through the model's chat template (the prompt
`serve`'s chat route builds), the kind of reply that quotes its input. For each round and
workload, every prompt is answered with OUTPUT_TOKENS greedy tokens, plainly and with each
draft, in one engine each (batch 1, KV cache as the artifact's). Reported: the median
tokens/s of each, the speedups, the drafted tokens kept, and whether every reply was token
for token the plain one (it must be). For a draft model also: its step's bytes as a share
of the target's, and the share of its drafts kept when it is made to draft one token at
every step (speculation pauses a draft that does not pay, after a few drafts).

With `--llama-server BIN --gguf Q4_0.gguf`, llama.cpp's own server (native build, `-np 1
-t 2 -tb 2 -fa off`: its flash attention, on by default, decoded at 31 tokens/s after a
300-token prompt here, against 58 without) answers the same prompts (as token ids,
greedy, `ignore_eos`) in each round right after llmpress, plainly and with its
prompt-lookup draft (`--spec-type ngram-simple`); its tokens/s are its replies' own decode
timings (`predicted_n` over `predicted_ms`), its kept share `draft_n_accepted` over
`draft_n`.

    python benchmarks/speculative.py [--artifact OUT] [--draft DRAFT_ARTIFACT] [--rounds 3]
        [--llama-server PATH/TO/llama.cpp/build/bin --gguf model-q4_0.gguf]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from batched_decode import cpu_flags  # noqa: E402
from llama_server import add_arguments, check_arguments, llama_server, version  # noqa: E402

PROMPTS, PROMPT_CHARS, OUTPUT_TOKENS = 6, 1200, 128


def passages() -> list[str]:
    from compress.calib_data.sources import read_texts

    data = ROOT.parent / "shared" / "data" / "wikitext-2-raw" / "test.txt"
    if not data.is_file():
        raise SystemExit(f"{data} is missing: the benchmark reads WikiText-2's test split")
    text = "\n".join(read_texts(str(data)))
    step = len(text) // PROMPTS
    return [text[i * step : i * step + PROMPT_CHARS] for i in range(PROMPTS)]


def workloads(tokenizer) -> dict[str, list[list[int]]]:
    """Token ids of each workload's prompts (the summaries' as serve's chat route builds
    them)."""
    from compress.serve.protocol import _chat_ids

    texts = passages()
    ask = "Summarise this text in a few sentences.\n\n"
    return {
        "continue": [tokenizer.encode(t) for t in texts],
        "summarise": [
            _chat_ids({"messages": [{"role": "user", "content": ask + t}]}, tokenizer)
            for t in texts
        ],
    }


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
        while not req.output:  # the prompt's prefill (in chunks) and first token:
            engine.step()  # not decode time
        t = time.perf_counter()
        while not engine.idle:
            engine.step()
        seconds += time.perf_counter() - t
        outputs.append(req.output)
    tokens = len(prompts) * (OUTPUT_TOKENS - 1)
    return outputs, tokens / seconds, spec


LLAMA_DRAFT = ("--spec-type", "ngram-simple")


def llama_replies(bin_dir: Path, gguf: Path, prompts, *extra: str) -> tuple[float, float | None]:
    """llama-server's decode tokens/s over the prompts (one at a time), and the share of
    its drafted tokens kept (None without drafts)."""
    ctx = max(map(len, prompts)) + OUTPUT_TOKENS + 8
    n = ms = drafted = kept = 0
    with llama_server(bin_dir, gguf, 1, ctx, "-fa", "off", *extra) as port:
        for prompt in prompts:
            body = {"prompt": list(prompt), "max_tokens": OUTPUT_TOKENS, "temperature": 0,
                    "ignore_eos": True}  # fmt: skip
            req = urllib.request.Request(
                f"http://127.0.0.1:{port}/v1/completions",
                json.dumps(body).encode(),
                {"Content-Type": "application/json"},
            )
            t = json.loads(urllib.request.urlopen(req, timeout=600).read())["timings"]
            n, ms = n + t["predicted_n"], ms + t["predicted_ms"]
            drafted, kept = drafted + t.get("draft_n", 0), kept + t.get("draft_n_accepted", 0)
    return n / ms * 1e3, kept / drafted if drafted else None


def forced_acceptance(weights, draft, prompts, kv) -> float:
    """The share of a draft model's (`draft`: its loaded weights) first drafts the target
    keeps when it drafts one token at every step, paused or not: how good the draft is,
    apart from whether it pays."""
    from compress.runtime.engine import Engine
    from compress.runtime.sampling import SamplingParams
    from compress.runtime.speculative import DraftModelProposer, Speculator

    max_len = max(map(len, prompts)) + OUTPUT_TOKENS + 8
    spec = Speculator(DraftModelProposer(draft, max_len, 0.0), max_k=1, k=1, adapt=False)
    engine = Engine(weights, max_batch=1, max_len=max_len, kv=kv, speculator=spec)
    engine.generate(prompts, SamplingParams(max_tokens=OUTPUT_TOKENS, ignore_eos=True))
    return spec.acceptance


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
    ap.add_argument("--draft", help="a draft model artifact to measure beside ngram")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    add_arguments(ap)
    args = ap.parse_args()
    check_arguments(args)

    from compress.model.loading import load_tokenizer, resolve
    from compress.runtime.kv_cache import KVScheme
    from compress.runtime.weights import load_weights

    ckpt = resolve(args.artifact or w4_artifact())
    weights = load_weights(ckpt, device="cpu")
    kv = KVScheme.of_artifact(ckpt.config)
    loads = workloads(load_tokenizer(ckpt))
    drafts = ["ngram"] + ([args.draft] if args.draft else [])
    names = {d: "ngram" if d == "ngram" else "draft model" for d in drafts}
    llama = ("llama-server plain", "llama-server ngram") if args.llama_server else ()
    runs = {w: {k: [] for k in ("plain", *names.values(), *llama)} for w in loads}
    llama_kept = {w: [] for w in loads}
    kept = {w: {names[d]: [] for d in drafts} for w in loads}
    identical, row_costs = True, []
    for r in range(args.rounds):
        for load, prompts in loads.items():
            plain, plain_tps, _ = replies(weights, prompts, kv, None)
            runs[load]["plain"].append(plain_tps)
            line = f"round {r} {load}: plain {plain_tps:.1f} tok/s"
            for d in drafts:
                out, tps, spec = replies(weights, prompts, kv, d)
                row_costs.append(spec.row_cost)
                identical &= out == plain
                runs[load][names[d]].append(tps)
                kept[load][names[d]].append(spec.acceptance)
                line += f", {names[d]} {tps:.1f} ({100 * spec.acceptance:.0f}% kept)"
            if args.llama_server:
                for name, extra in zip(llama, ((), LLAMA_DRAFT), strict=True):
                    tps, share = llama_replies(args.llama_server, args.gguf, prompts, *extra)
                    runs[load][name].append(tps)
                    line += f", {name} {tps:.1f}"
                llama_kept[load].append(share)
            print(line + f", identical so far {identical}")
    medians = {w: {k: statistics.median(v) for k, v in rows.items()} for w, rows in runs.items()}
    record = {
        "command": "python benchmarks/speculative.py"
        + (f" --draft {args.draft}" if args.draft else ""),
        "artifact": "default model, rtn:w4g64" if args.artifact is None else args.artifact,
        "draft": args.draft,
        "prompts": PROMPTS,
        "prompt_tokens": {w: [len(p) for p in ps] for w, ps in loads.items()},
        "output_tokens": OUTPUT_TOKENS,
        "runs_tok_s": {
            w: {k: [round(x, 1) for x in v] for k, v in rows.items()} for w, rows in runs.items()
        },
        "median_tok_s": medians,
        "speedup": {
            w: {k: m[k] / m["plain"] for k in m if k != "plain" and not k.startswith("llama")}
            for w, m in medians.items()
        },
        "acceptance": {
            w: {k: statistics.median(v) for k, v in ks.items()} for w, ks in kept.items()
        },
        "greedy_identical": identical,
        "cpu": cpu_flags(),
        "threads": torch.get_num_threads(),
        "row_cost": statistics.median(row_costs),  # a checked row, in decode steps
    }
    if args.llama_server:
        record["command"] += f" --llama-server LLAMA_BIN --gguf {args.gguf.name}"
        record["llama_cflags"] = args.llama_cflags
        record["llama_server"] = {
            "build": f"{args.gguf.name} ({version(args.llama_server)}), -np 1 -t 2 -tb 2 -fa off",
            "draft": " ".join(LLAMA_DRAFT),
            "speedup": {
                w: m["llama-server ngram"] / m["llama-server plain"] for w, m in medians.items()
            },
            "acceptance": {
                w: statistics.median(v) if None not in v else None for w, v in llama_kept.items()
            },
        }
    if args.draft:
        draft = load_weights(resolve(args.draft), device="cpu")
        record["draft_step_bytes"] = draft.step_bytes / weights.step_bytes
        record["draft_forced_acceptance"] = {
            w: forced_acceptance(weights, draft, prompts, kv) for w, prompts in loads.items()
        }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "speculative.json").write_text(json.dumps(record, indent=2) + "\n")
    print(
        json.dumps({k: record[k] for k in ("speedup", "acceptance", "greedy_identical")}, indent=2)
    )


if __name__ == "__main__":
    main()
