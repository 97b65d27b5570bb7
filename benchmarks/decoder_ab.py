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
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from batched_decode import cpu_flags  # noqa: E402
from hugepages import family_artifact  # noqa: E402
from interleave import running_engine, step_medians  # noqa: E402
from kernel_ab import builds, git_rev  # noqa: E402

import compress.kernels.cpu as cpu  # noqa: E402
from compress.kernels.build import _declare  # noqa: E402
from compress.model.loading import resolve  # noqa: E402
from compress.runtime.kv_cache import kv_scheme, parse_kv  # noqa: E402
from compress.runtime.weights import load_weights  # noqa: E402


class _Present:
    """A library as _declare sees it: functions an earlier build lacks take their
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", required=True, help="the earlier revision")
    ap.add_argument("--change", required=True, help="what differs, for the record")
    ap.add_argument("--families", default="qwen2_moe")
    ap.add_argument("--batches", default="1")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument(
        "--kv", default="", help="KV-cache schemes, comma-separated (default: the artifact's)"
    )
    ap.add_argument("--name", default="decoder_ab", help="the record's file name")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()
    libs = builds(args.rev)
    for lib in libs.values():
        _declare(_Present(lib))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.families.split(","):
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
