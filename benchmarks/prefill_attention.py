"""The served prefill's causal attention: one C call a layer for every chunk of a step
(`llmp_prefill_attention`) against torch's per-chunk blocks (`_prefill_attention`, what
CPU prefills ran before, and the tests' reference), interleaved in one process over the
same queries, keys and values.

Head layout of the default model (9 query heads over 3 KV heads, head dim 64). Shapes:
a step prefilling 28 prompts of 18 tokens (32 requests arriving together), one 256-token
chunk, a 1,024-token prompt in one chunk, and 256-token chunks over 768- and 1,792-token
prefixes (a long prompt's later chunks). Reported: the median milliseconds of one layer's
attention for each, and torch's time over C's. With `--rev REV` the C call as it was at
that git revision runs as a third arm in the same rounds (built as kernel_ab.py builds it),
and the table gains its time over today's and whether both give the same bits.

    python benchmarks/prefill_attention.py [--rounds 30] [--threads 2] [--rev REV]
        [--name prefill_attention]

With LLMPRESS_KERNEL_FLAGS set (e.g. "-O3 -mavx2 -mfma -mf16c -fopenmp") both C arms are
built with those flags instead of -march=native: another instruction set's paths, timed on
this host; the record names the flags.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from batched_decode import cpu_flags  # noqa: E402
from kernel_ab import builds, takes_softcap  # noqa: E402

from compress.kernels import cpu  # noqa: E402
from compress.kernels.cpu import prefill_attention, set_threads  # noqa: E402
from compress.runtime.model import _prefill_attention  # noqa: E402

HEADS, KV_HEADS, D, SCALE = 9, 3, 64, 0.125
CASES = {  # name: [(start, rows)] per chunk of the step
    "28 prompts of 18 tokens": [(0, 18)] * 28,
    "one 256-token chunk": [(0, 256)],
    "a 1,024-token prompt": [(0, 1024)],
    "256 rows over 768 cached": [(768, 256)],
    "256 rows over 1,792 cached": [(1792, 256)],
}


def step(chunks, gen):
    """The step's q [N, heads, D] and each chunk's keys/values over its whole prefix."""
    n = sum(t for _, t in chunks)
    q = torch.randn(n, HEADS, D, generator=gen)
    parts, a = [], 0
    for start, t in chunks:
        k = torch.randn(KV_HEADS, start + t, D, generator=gen)
        v = torch.randn(KV_HEADS, start + t, D, generator=gen)
        parts.append((a, a + t, k, v, start))
        a += t
    return q, parts


def with_torch(q, out, parts):
    for a, b, k, v, start in parts:
        o = _prefill_attention(q[a:b].transpose(0, 1), k, v, start, SCALE)
        out[a:b] = o.transpose(0, 1).reshape(b - a, HEADS * D)


def earlier_kernel(rev: str):
    """`llmp_prefill_attention` as it was at `rev`, as a function of (q, out, parts)."""
    lib = builds(rev)["earlier"]
    p, i, f = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
    capped = takes_softcap(rev)  # else the wrapper's softcap (0: none) is left off
    lib.llmp_prefill_attention.argtypes = [p, i, i, i, i, f, i, *[f] * capped]
    lib.llmp_prefill_attention.restype = ctypes.c_int
    lib.llmp_set_threads(cpu.library().llmp_get_threads())
    call = lib.llmp_prefill_attention
    shim = SimpleNamespace(llmp_prefill_attention=call if capped else lambda *a: call(*a[:-1]))

    def run(q, out, parts):
        now = cpu.library
        cpu.library = lambda: shim  # the wrapper's checks and layout, the earlier kernel
        try:
            prefill_attention(q, out, parts, SCALE)
        finally:
            cpu.library = now

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rev", help="also time the C call at this git revision")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--name", default="prefill_attention", help="the results' file name")
    args = ap.parse_args()
    if args.rev:  # named by its commit: HEAD or a branch moves on
        args.rev = subprocess.check_output(
            ["git", "rev-parse", "--short", args.rev], cwd=ROOT, text=True
        ).strip()
    set_threads(args.threads)
    earlier = earlier_kernel(args.rev) if args.rev else None
    gen = torch.Generator().manual_seed(0)
    rows = []
    for name, chunks in CASES.items():
        q, parts = step(chunks, gen)
        ref, got = torch.empty(q.shape[0], HEADS * D), torch.empty(q.shape[0], HEADS * D)
        old = torch.empty_like(got)
        arms = {
            "torch": partial(with_torch, q, ref, parts),
            "c": partial(prefill_attention, q, got, parts, SCALE),
        }
        if earlier is not None:
            arms["c_earlier"] = partial(earlier, q, old, parts)
        times = {name: [] for name in arms}
        for r in range(args.rounds + 2):  # the first two warm up
            for arm in list(arms) if r % 2 == 0 else list(arms)[::-1]:
                t0 = time.perf_counter()
                arms[arm]()
                times[arm].append(time.perf_counter() - t0)
        med = {k: statistics.median(v[2:]) * 1e3 for k, v in times.items()}
        row = {
            "case": name,
            "chunks": len(chunks),
            "rows": q.shape[0],
            "torch_ms": med["torch"],
            "c_ms": med["c"],
            "speedup": med["torch"] / med["c"],
            "max_abs_diff": (ref - got).abs().max().item(),
        }
        if earlier is not None:
            row["c_earlier_ms"] = med["c_earlier"]
            row["earlier_over_now"] = med["c_earlier"] / med["c"]
            row["same_bits_as_earlier"] = bool(torch.equal(old, got))
        rows.append(row)
        print(json.dumps(row), flush=True)
    flags = os.environ.get("LLMPRESS_KERNEL_FLAGS")
    record = {
        "benchmark": "prefill_attention",
        "command": (f'LLMPRESS_KERNEL_FLAGS="{flags}" ' if flags else "")
        + "python benchmarks/prefill_attention.py"
        + (f" --rev {args.rev}" if args.rev else "")
        + (f" --name {args.name}" if args.name != "prefill_attention" else ""),
        "rev": args.rev,
        "cpu": cpu_flags(),
        "kernel_flags": flags,  # None: -march=native
        "threads": args.threads,
        "rounds": args.rounds,
        "heads": [HEADS, KV_HEADS, D],
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
