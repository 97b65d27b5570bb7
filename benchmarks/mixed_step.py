"""A serving step with prompt rows and decode rows: in one C call (Model.step) against a
prefill pass followed by a decode step (what every such step ran before), interleaved in
one process over the same weights.

While prompts are being prefilled, the running sequences still take a token each step.
`Model.step` runs both kinds of rows through one pass of the one-call prefill, so the
step reads the weights once; the two-pass form reads them for the prefill and again for
the decode step. Steps of each shape alternate between the two forms, the order reversed
every other round; medians of each, and whether every row's logits and the cached k/v
are the same bits.

Shapes (serve's default 192-token budget): 8 and 32 streams decoding beside a 192-token
chunk of a long prompt after 1,344 cached tokens (benchmarks/prefill_budget.py's
workload); 9 and 27 streams beside the next 192 tokens of 32 short arrivals (the steps
in which benchmarks/serve_load.py's 32 clients ramp up); 8 streams beside 2 prompts of 21.
Streams have 100 tokens cached. The default model at `rtn:w4g64zp` with an int8 lm_head
(serve_load's artifact), over the KV caches of `--kv`.

    python benchmarks/mixed_step.py [--kv none,int8,int4] [--rounds 20] [--name mixed_step]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from batched_decode import cpu_flags  # noqa: E402
from prefill_step import serve_artifact  # noqa: E402

from compress.kernels.cpu import set_threads  # noqa: E402
from compress.model.loading import resolve  # noqa: E402
from compress.runtime.kv_cache import KVCache, parse_kv  # noqa: E402
from compress.runtime.model import Chunk, Model  # noqa: E402
from compress.runtime.weights import load_weights  # noqa: E402

STREAM_CONTEXT = 100
SHAPES = {  # name: (streams decoding, prefix cached before the chunks, chunk sizes)
    "8 streams + 192 after 1,344 cached": (8, 1344, [192]),
    "32 streams + 192 after 1,344 cached": (32, 1344, [192]),
    "9 streams + 9 prompts of 21 and 3": (9, 0, [21] * 9 + [3]),
    "27 streams + 5 prompts of 21": (27, 0, [21] * 5),
    "8 streams + 2 prompts of 21": (8, 0, [21, 21]),
}


def timed_step(model: Model, cache: KVCache, shape: tuple, one_call: bool, kept):
    """Seconds of one step, and every row's logits and the last layer's k/v it cached.
    Streams are slots 0..streams-1, the chunks the slots after them."""
    streams, prefix, sizes = shape
    gen = torch.Generator().manual_seed(len(sizes))
    first = streams
    chunks = [
        Chunk(
            torch.randint(model.w.shape.vocab, (n,), generator=gen),
            first + i,
            prefix,
            prefix=None if kept is None else list(kept),
        )
        for i, n in enumerate(sizes)
    ]
    tokens = torch.randint(model.w.shape.vocab, (streams,), generator=gen).tolist()
    slots = list(range(streams))
    cache.lengths[:streams] = STREAM_CONTEXT
    cache.lengths[first : first + len(sizes)] = prefix
    t = time.perf_counter()
    if one_call:
        logits, rows = model.step(chunks, cache, tokens, slots)
    else:
        logits = model.prefill_batch(chunks, cache)
        rows = model.decode_ids(tokens, cache, slots)
    seconds = time.perf_counter() - t
    layer = model.w.shape.layers - 1
    kv = cache.read(layer, torch.arange(streams), STREAM_CONTEXT + 1)
    kv += cache.read(layer, torch.arange(first, first + len(sizes)), prefix + max(sizes))
    return seconds, [*logits, rows, *kv]


def compare(artifact: Path, rounds: int, kv: str) -> list[dict]:
    weights, scheme = load_weights(resolve(str(artifact))), parse_kv(kv)
    s = weights.shape
    model = Model(weights, 2048)
    rows = []
    for name, shape in SHAPES.items():
        streams, prefix, sizes = shape
        slots = streams + len(sizes)
        # every position the step writes prepared, the pool no larger: random k/v (a
        # step's cost does not depend on them) for the streams' context and the prefix
        needs = [STREAM_CONTEXT + 1] * streams + [prefix + n for n in sizes]
        probe = KVCache(s.layers, 1, s.kv_heads, 2048, s.head_dim, scheme, blocks=1)
        blocks = sum(probe.blocks_for(n) for n in needs)
        cache = KVCache(s.layers, slots, s.kv_heads, 2048, s.head_dim, scheme, blocks=blocks)
        for slot, n in enumerate(needs):
            cache.prepare(slot, 0, n)
        cache._fill_random(torch.Generator().manual_seed(0))
        kept = None
        if prefix and scheme.bits is not None:  # a chunked prompt's k/v in full precision
            gen = torch.Generator().manual_seed(1)
            size = (s.kv_heads, prefix, s.head_dim)
            kept = [(torch.randn(size, generator=gen), torch.randn(size, generator=gen))
                    for _ in range(s.layers)]  # fmt: skip
        _, a = timed_step(model, cache, shape, True, kept)
        _, b = timed_step(model, cache, shape, False, kept)
        same = all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
        times = {"one call": [], "two passes": []}
        for r in range(rounds):
            for one_call in (True, False) if r % 2 else (False, True):
                seconds, _ = timed_step(model, cache, shape, one_call, kept)
                times["one call" if one_call else "two passes"].append(seconds)
        med = {k: statistics.median(v) for k, v in times.items()}
        row = {
            "kv": kv,
            "shape": name,
            "streams": streams,
            "prompt_tokens": sum(sizes),
            "ms": {k: 1e3 * v for k, v in med.items()},
            "speedup": med["two passes"] / med["one call"],
            "same_bits": same,
        }
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kv", default="none,int8,int4", help="KV caches, comma-separated")
    ap.add_argument("--rounds", type=int, default=20, help="steps of each shape, each way")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--name", default="mixed_step", help="the results' file name")
    args = ap.parse_args()
    set_threads(2)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        art = serve_artifact(Path(tmp))
        for kv in args.kv.split(","):
            rows += compare(art, args.rounds, kv)
    record = {
        "benchmark": "mixed_step",
        "command": "python benchmarks/mixed_step.py " + " ".join(sys.argv[1:]),
        "cpu": cpu_flags(),
        "threads": 2,
        "rounds": args.rounds,
        "stream_context": STREAM_CONTEXT,
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
