"""The one-call C decoder of this checkout against the one at an earlier git revision,
built alike and stepping the same engine's weights interleaved in one process.

A whole decode step, not one kernel: what a change to the decoder's layer loop (the
experts' grouped passes, the attention, the norms) gives where it is spent. Each build
drives its own engine over the same loaded weights (32-token prompt, up to 300 out,
restarted when done); steps alternate between the builds, the order reversed every other
round, so a noisy neighbour slows both alike. Reported: median milliseconds per step of
each and their ratio. The artifacts: benchmarks/families.py's realistic-width random
models at its recipe (rtn:w4g64).

    python benchmarks/decoder_ab.py --rev REV --change TEXT [--families qwen2_moe] [--steps 1500]
        [--kv int8] [--name decoder_ab]

With --contexts, long contexts instead: the default model (rtn:w4g64, int8 lm_head)
decodes one step over caches filled with random keys and values at each context (one
cache per build, filled alike, reset to the context before every step), the builds taking
turns; reported as above. (The two builds' logits are not compared: over random caches the
model is chaotic, a 1e-6 change to the keys moving its logits by 2; the suite tests the
kernels against references.)
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from batched_decode import cpu_flags  # noqa: E402
from hugepages import default_artifact, family_artifact  # noqa: E402
from interleave import running_engine, step_medians  # noqa: E402
from kernel_ab import builds, git_rev  # noqa: E402

import compress.kernels.cpu as cpu  # noqa: E402
from compress.kernels.c_api import declare  # noqa: E402
from compress.model.loading import resolve  # noqa: E402
from compress.runtime.kv_cache import KVCache, kv_scheme, parse_kv  # noqa: E402
from compress.runtime.model import Model  # noqa: E402
from compress.runtime.weights import load_weights  # noqa: E402


class _Present:
    """A library as declare sees it: functions an earlier build lacks take their
    declarations harmlessly."""

    def __init__(self, lib):
        self.lib = lib

    def __getattr__(self, name):
        try:
            return getattr(self.lib, name)
        except AttributeError:
            return SimpleNamespace()


def alternate(artifact: Path, libs: dict, steps: int, batch: int, kv: str | None = None) -> dict:
    """Median ms per step of each build over the same weights, with the artifact's KV cache
    or `kv`. Engines are made with this checkout's library, whose step workspace is the
    larger where the two differ."""
    ckpt = resolve(str(artifact))
    weights = load_weights(ckpt)
    scheme = parse_kv(kv) if kv else kv_scheme(None, ckpt.config)
    current = cpu.library

    def fresh():
        cpu.library = current
        return running_engine(weights, scheme, batch)

    def before(name: str) -> None:
        cpu.library = lambda lib=libs[name]: lib
        cpu.set_threads(2)

    try:
        med = step_medians({name: fresh for name in libs}, steps, before)
    finally:
        cpu.library = current
    return {"artifact": artifact.name, "kv": kv or "the artifact's", "batch": batch,
            "steps": steps, "ms_per_step": med,
            "now / earlier": med["earlier"] / med["now"]}  # fmt: skip


def long_context(model: Model, libs: dict, kv: str, batch: int, context: int, steps: int):
    """Median ms per decode step of each build at `context` tokens of random cache."""
    s, current = model.w.shape, cpu.library
    caches = {}
    for name in libs:
        c = KVCache(s.layers, batch, s.kv_heads, context + 1, s.head_dim, parse_kv(kv or "none"))
        c.fill_random(batch, context + 1, torch.Generator().manual_seed(0))
        caches[name] = c
    tokens, slots = list(range(5, 5 + batch)), list(range(batch))
    times = {name: [] for name in libs}
    try:
        for r in range(steps + 2):  # the first two warm up
            for name in libs if r % 2 else list(libs)[::-1]:
                cpu.library = lambda lib=libs[name]: lib
                cpu.set_threads(2)
                caches[name].lengths[:batch] = context
                t = time.perf_counter()
                model.decode_ids(tokens, caches[name], slots)
                times[name].append(time.perf_counter() - t)
    finally:
        cpu.library = current
    med = {name: 1e3 * statistics.median(v[2:]) for name, v in times.items()}
    return {"artifact": "default model, rtn:w4g64, int8 lm_head", "kv": kv or "none",
            "batch": batch, "context": context, "steps": steps, "ms_per_step": med,
            "now / earlier": med["earlier"] / med["now"]}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", required=True, help="the earlier revision")
    ap.add_argument("--change", required=True, help="what differs, for the record")
    ap.add_argument("--families", default="qwen2_moe")
    ap.add_argument("--batches", default="1")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--contexts", default="", help="long contexts of the default model instead")
    ap.add_argument(
        "--kv", default="", help="KV-cache schemes, comma-separated (default: the artifact's)"
    )
    ap.add_argument("--name", default="decoder_ab", help="the record's file name")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()
    libs = builds(args.rev)
    for lib in libs.values():
        declare(_Present(lib))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.contexts:
            model = Model(load_weights(resolve(str(default_artifact(Path(tmp))))), 8200)
            for kv in args.kv.split(","):
                for batch in map(int, args.batches.split(",")):
                    for context in map(int, args.contexts.split(",")):
                        row = long_context(model, libs, kv, batch, context, args.steps)
                        print(json.dumps(row), flush=True)
                        rows.append(row)
        for name in args.families.split(",") if not args.contexts else []:
            artifact = family_artifact(Path(tmp), name)
            for kv in args.kv.split(","):
                for batch in map(int, args.batches.split(",")):
                    row = {"family": name, **alternate(artifact, libs, args.steps, batch, kv)}
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    record = {"command": "python benchmarks/decoder_ab.py " + shlex.join(sys.argv[1:]),
              "cpu": cpu_flags(), "threads": 2, "rev": git_rev(args.rev), "change": args.change,
              "rows": rows}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
