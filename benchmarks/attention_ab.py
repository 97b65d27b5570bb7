"""The C decode attention of this checkout against the one at an earlier git revision,
built the same way and called interleaved in one process over the same fp32 KV cache.

A decode step streams the weights through the caches, so each layer's keys and values
come from memory: between steps a 96 MB read evicts them, and a step is the attention of
every layer at batch 1, at the head layouts of the default model (9 query heads over 3
KV heads, 30 layers) and of benchmarks/families.py's MoE rows (16 over 4, 16 layers),
head dim 64, at several context lengths and batch sizes, over an fp32, int8 or int4 (KIVI)
cache (`--kv`). Reported: median microseconds per layer call of each build (a ctypes
call's few microseconds included, the same for both) and their ratio.

    python benchmarks/attention_ab.py [--rev HEAD] [--kv none,int8,int4] [--contexts 100,400,1500]

Both builds read the cache through this checkout's C struct (the paged layout), so the
earlier revision must have it too.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from batched_decode import cpu_flags  # noqa: E402
from kernel_ab import builds, git_rev, takes_softcap  # noqa: E402

from compress.kernels import cpu  # noqa: E402
from compress.runtime.kv_cache import KVCache, parse_kv  # noqa: E402

LAYOUTS = {"default model (9/3 heads, 30 layers)": (9, 3, 30), "MoE rows (16/4, 16)": (16, 4, 16)}
D = 64


def attention(lib, capped: bool = True):
    """The build's decode attention as f(..., scale, window, out); `capped`: it also takes
    a softcap after the window (0 here: none)."""
    p, i, f = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
    lib.llmp_decode_attention.argtypes = [p, i, p, p, p, p, p, i, i, f, i, *[f] * capped, p]
    lib.llmp_decode_attention.restype = None
    fn = lib.llmp_decode_attention
    # both through the same Python work (a bare fn was 2-3% sooner at 100 tokens)
    return (lambda *a: fn(*a[:-1], 0.0, a[-1])) if capped else (lambda *a: fn(*a[:-1], a[-1]))


def step_times(fns: dict, kv: str, batch: int, heads: int, kv_heads: int, layers: int,
               context: int, steps: int):  # fmt: skip
    """Median µs per layer call of each build: `steps` steps, the builds taking turns. Each
    step writes its token at position context - 1 (a KIVI group's quantization when that
    completes one: choose contexts that do not end on a multiple of 32 to time reads alone)."""
    cache = KVCache(layers, batch, kv_heads, context + 8, D, scheme=parse_kv(kv))
    cache.fill_random(batch, context, torch.Generator().manual_seed(0))  # blocks in pool order
    kvc = ctypes.byref(cpu.kv_struct(cache))
    torch.manual_seed(0)
    q = torch.randn(batch, heads, D)
    k, v = torch.randn(batch, kv_heads, D), torch.randn(batch, kv_heads, D)
    slots = torch.arange(batch, dtype=torch.int64)
    positions = torch.full((batch,), context - 1, dtype=torch.int64)
    out = torch.empty(batch, heads, D)
    flush = torch.ones(24 << 20)  # 96 MB: more than the L3 cache
    times = {name: [] for name in fns}
    for s in range(steps):
        for name, fn in fns.items() if s % 2 else reversed(fns.items()):
            flush.sum()
            t = time.perf_counter()
            for layer in range(layers):
                fn(kvc, layer, cpu._ptr(q), cpu._ptr(k), cpu._ptr(v), cpu._ptr(slots),
                   cpu._ptr(positions), batch, heads, D**-0.5, 0, cpu._ptr(out))  # fmt: skip
            times[name].append((time.perf_counter() - t) / layers * 1e6)
    return {name: statistics.median(v) for name, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", default="HEAD", help="the earlier revision")
    ap.add_argument(
        "--change",
        default="weighted_rows (p · V over fp32 rows) 64 channels at a time, eight "
        "accumulators (the earlier: 32, four)",
    )
    ap.add_argument("--kv", default="none", help="cache kinds, comma-separated: none,int8,int4")
    ap.add_argument("--batches", default="1", help="sequences a step, comma-separated")
    ap.add_argument("--contexts", default="100,400,1500")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--name", default="attention_ab", help="the record's file name")
    args = ap.parse_args()
    libs = builds(args.rev)
    for lib in libs.values():
        lib.llmp_set_threads(args.threads)
    capped = {"earlier": takes_softcap(args.rev), "now": True}
    fns = {name: attention(lib, capped[name]) for name, lib in libs.items()}
    rows = []
    grid = [(kv, int(b), layout, int(c)) for kv in args.kv.split(",")
            for b in args.batches.split(",") for layout in LAYOUTS
            for c in args.contexts.split(",")]  # fmt: skip
    for kv, batch, layout, context in grid:
        heads, kv_heads, layers = LAYOUTS[layout]
        us = step_times(fns, kv, batch, heads, kv_heads, layers, context, args.steps)
        early, now = us["earlier"], us["now"]
        row = {"kv": kv, "batch": batch, "layout": layout, "context": context,
               "earlier_us": round(early, 2), "now_us": round(now, 2),
               "speedup": round(early / now, 3)}  # fmt: skip
        print(row, flush=True)
        rows.append(row)
    record = {
        "command": "python benchmarks/attention_ab.py " + shlex.join(sys.argv[1:]),
        "cpu": cpu_flags(),
        "threads": args.threads,
        "earlier": git_rev(args.rev),
        "change": args.change,
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
