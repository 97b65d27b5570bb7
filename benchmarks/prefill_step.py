"""A prefill step's blocks in one C call against the same step op by op, interleaved in one
process over the same weights.

`Model.prefill_batch` runs every block of a step in one C call (llmp_prefill_layers: the
one-call decoder's layer loop with the causal prefill attention) when every block linear
is packed; otherwise op by op from Python (`per op`: what every prefill step ran before
the one-call path). Steps
of each shape alternate between the two, the order reversed every other round, so a noisy
neighbour slows both alike; medians of each, and whether their logits and cached k/v are
the same bits.

Shapes: the 32 short prompts of `benchmarks/serve_load.py` as a serve step takes them
under the default 192-token budget (9 prompts of 21 tokens and the start of a 10th),
two such prompts, one 192-token chunk, and a 192-token chunk after 1,344 cached tokens
(the tail of a long prompt). Artifacts: the default model at `rtn:w4g64zp` with an int8
lm_head (serve_load's), and with `--families` benchmarks/families.py's realistic-width
random models at its recipe. `--kv int8,int4`: over those KV caches instead of fp32;
there the tail of a long prompt attends to its earlier chunks in full precision
(Chunk.prefix, as serve keeps a chunked prompt's over a quantized cache).

    python benchmarks/prefill_step.py [--families qwen2_moe] [--kv none] [--rounds 30]
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
from hugepages import family_artifact  # noqa: E402

from compress.kernels.cpu import set_threads  # noqa: E402
from compress.model.loading import resolve  # noqa: E402
from compress.pipeline import compress  # noqa: E402
from compress.recipe import parse_quant, parse_recipe  # noqa: E402
from compress.runtime.kv_cache import KVCache, parse_kv  # noqa: E402
from compress.runtime.model import Chunk, Model  # noqa: E402
from compress.runtime.weights import load_weights  # noqa: E402

SHAPES = {  # name: (prefix cached before the step, chunk sizes)
    "32 arrivals, first 192 tokens": (0, [21] * 9 + [3]),
    "2 prompts of 21": (0, [21, 21]),
    "1 chunk of 192": (0, [192]),
    "192 after 1,344 cached": (1344, [192]),
}


def timed_step(
    model: Model, cache: KVCache, prefix: int, sizes: list[int], one_call: bool, kept=None
):
    """Seconds of one step (its chunks at slots 0.., each after `prefix` cached tokens,
    read from `kept` where given: the prompt's k/v in full precision, per layer), and its
    logits and the last layer's cached k/v."""
    backend = model.backend
    saved = backend.prefill
    if not one_call:
        backend.prefill = lambda *a: False
    gen = torch.Generator().manual_seed(len(sizes))
    chunks = [
        Chunk(
            torch.randint(model.w.shape.vocab, (n,), generator=gen),
            slot,
            prefix,
            prefix=None if kept is None else list(kept),
        )
        for slot, n in enumerate(sizes)
    ]
    for slot in range(len(sizes)):
        cache.lengths[slot] = prefix
    try:
        t = time.perf_counter()
        logits = model.prefill_batch(chunks, cache)
        seconds = time.perf_counter() - t
    finally:
        backend.prefill = saved
    layer = model.w.shape.layers - 1
    kv = cache.read(layer, torch.arange(len(sizes)), prefix + max(sizes))
    return seconds, [*logits, *kv]


def compare(artifact: Path, rounds: int, kv: str = "none") -> list[dict]:
    weights, scheme = load_weights(resolve(str(artifact))), parse_kv(kv)
    s = weights.shape
    model = Model(weights, 2048)
    rows = []
    for name, (prefix, sizes) in SHAPES.items():
        cache = KVCache(s.layers, len(sizes), s.kv_heads, 2048, s.head_dim, scheme)
        if prefix:  # the cached part, written once (random k/v: a step's cost is the same)
            cache.fill_random(len(sizes), prefix, torch.Generator().manual_seed(0))
        kept = None
        if prefix and scheme.bits is not None:
            gen = torch.Generator().manual_seed(1)
            shape = (s.kv_heads, prefix, s.head_dim)
            kept = [(torch.randn(shape, generator=gen), torch.randn(shape, generator=gen))
                    for _ in range(s.layers)]  # fmt: skip
        _, a = timed_step(model, cache, prefix, sizes, True, kept)
        _, b = timed_step(model, cache, prefix, sizes, False, kept)
        same = all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
        times = {"one call": [], "per op": []}
        for r in range(rounds):
            for one_call in (True, False) if r % 2 else (False, True):
                seconds, _ = timed_step(model, cache, prefix, sizes, one_call, kept)
                times["one call" if one_call else "per op"].append(seconds)
        med = {k: statistics.median(v) for k, v in times.items()}
        tokens = sum(sizes)
        row = {
            "artifact": artifact.name,
            "kv": kv,
            "shape": name,
            "tokens": tokens,
            "ms": {k: 1e3 * v for k, v in med.items()},
            "tok_s": {k: tokens / v for k, v in med.items()},
            "speedup": med["per op"] / med["one call"],
            "same_bits": same,
        }
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def serve_artifact(folder: Path) -> Path:
    """The load test's artifact (benchmarks/serve_load.py): the default model at
    rtn:w4g64zp with an int8 lm_head, written to folder/default-w4."""
    art = folder / "default-w4"
    recipe = parse_recipe({"stages": [parse_quant("rtn:w4g64zp")], "lm_head": "w8"})
    compress("default", recipe, art, log=lambda _: None)
    return art


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default="", help="benchmarks/families.py rows, too")
    ap.add_argument("--kv", default="none", help="KV caches, comma-separated: none,int8,int4")
    ap.add_argument("--rounds", type=int, default=30, help="steps of each shape, each way")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--name", default="prefill_step", help="the results' file name")
    args = ap.parse_args()
    set_threads(2)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        art = serve_artifact(Path(tmp))
        for kv in args.kv.split(","):
            rows += compare(art, args.rounds, kv)
            for family in filter(None, args.families.split(",")):
                rows += compare(family_artifact(Path(tmp), family), args.rounds, kv)
    record = {
        "benchmark": "prefill_step",
        "command": "python benchmarks/prefill_step.py " + " ".join(sys.argv[1:]),
        "cpu": cpu_flags(),
        "threads": 2,
        "rounds": args.rounds,
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
