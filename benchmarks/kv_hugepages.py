"""Decode over a long context with the KV cache in 4 KB pages against the same cache in
2 MB pages, one process, steps alternating between the two, so that a noisy neighbour
slows both alike.

A decode step's attention reads every cached block of every sequence: at thousands of
tokens that is most of the step, and in 4 KB pages each block starts with a TLB miss and a
stop for the hardware prefetchers. Each case allocates two caches of the same kind
(LLMPRESS_HUGEPAGES=0, then 1), fills both with the same random keys and values, and
times one decode step of the default model (rtn:w4g64, int8 lm_head) over each in turn.
Reported: median milliseconds per step of each, their ratio, and whether both gave the
same logits.

    python benchmarks/kv_hugepages.py [--kv none,int8,int4] [--contexts 2048,4000]
        [--batches 1,8] [--steps 25]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hugepages import default_artifact
from interleave import save

from compress.kernels import hugepages
from compress.kernels.cpu import set_threads
from compress.model.loading import resolve
from compress.runtime.kv_cache import KVCache, parse_kv
from compress.runtime.model import Model
from compress.runtime.weights import load_weights


def cache(model: Model, kv: str, batch: int, context: int, huge: bool) -> KVCache:
    """A cache of `batch` sequences holding `context` random tokens each (seeded alike),
    in 2 MB pages or not."""
    s = model.w.shape
    os.environ["LLMPRESS_HUGEPAGES"] = "1" if huge else "0"
    hugepages.available.cache_clear()
    try:
        c = KVCache(s.layers, batch, s.kv_heads, context + 1, s.head_dim, parse_kv(kv))
    finally:
        os.environ.pop("LLMPRESS_HUGEPAGES")
        hugepages.available.cache_clear()
    c.fill_random(batch, context + 1, torch.Generator().manual_seed(0))
    return c


def compare(model: Model, kv: str, batch: int, context: int, steps: int) -> dict:
    caches = {"4 KB": cache(model, kv, batch, context, False),
              "2 MB": cache(model, kv, batch, context, True)}  # fmt: skip
    tokens, slots = list(range(5, 5 + batch)), list(range(batch))
    times, logits = {name: [] for name in caches}, {}
    for r in range(steps + 2):  # the first two warm up
        for name in caches if r % 2 else list(caches)[::-1]:
            c = caches[name]
            c.lengths[:batch] = context
            t = time.perf_counter()
            logits[name] = model.decode_ids(tokens, c, slots)
            times[name].append(time.perf_counter() - t)
    ms = {name: 1e3 * statistics.median(v[2:]) for name, v in times.items()}
    row = {
        "kv": kv,
        "batch": batch,
        "context": context,
        "ms": ms,
        "speedup": ms["4 KB"] / ms["2 MB"],
        "same_logits": bool(torch.equal(logits["4 KB"], logits["2 MB"])),
    }
    print(row, flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kv", default="none,int8,int4")
    ap.add_argument("--contexts", default="2048,4000")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = ap.parse_args()
    set_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        model = Model(load_weights(resolve(str(default_artifact(Path(tmp))))), 4200)
        rows = [
            compare(model, kv, int(b), int(ctx), args.steps)
            for kv in args.kv.split(",")
            for b in args.batches.split(",")
            for ctx in args.contexts.split(",")
        ]
    command = "python benchmarks/kv_hugepages.py " + " ".join(sys.argv[1:])
    save(args.out, "kv_hugepages.json", command.strip(), rows)


if __name__ == "__main__":
    main()
