"""How much of a batch-1 decode step is left outside C: the same weights decoded three
ways in one process, steps alternating so that a noisy neighbour slows all alike.

- `blocks in C`: the one-call decoder runs the blocks; the embedding lookup, final norm,
  lm_head call, positions and lengths are torch operations around it;
- `head in C`: the same call runs the final norm and the packed head too;
- `ids to logits in C` (what the engine runs): one call from token ids to logits
  (`llmp_decode_tokens`), greedy sampling's argmax in C as well.

Each engine runs one sequence (32-token prompt, up to 300 out, restarted when done).
Reported: median milliseconds per step of each and the ratios to `blocks in C`. The
artifacts: the default model as runtime_speed.py makes it (rtn:w4g64, int8 lm_head) and
benchmarks/families.py's realistic-width random models of `--families` at its recipe.

    python benchmarks/decode_step.py [--families qwen3_moe] [--steps 1500]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hugepages import default_artifact, family_artifact
from interleave import running_engine, save, step_medians

import compress.runtime.sampling as sampling
from compress.kernels.cpu import set_threads
from compress.model.loading import resolve
from compress.runtime.kv_cache import kv_scheme
from compress.runtime.weights import load_weights

HERE = Path(__file__).resolve().parent
VARIANTS = ("blocks in C", "head in C", "ids to logits in C")


def _engine(weights, scheme, variant: str):
    e = running_engine(weights, scheme)
    fused = e.model.backend.fused
    if fused is None or fused.ctx is None:
        raise SystemExit("this artifact has no packed head: nothing to compare")
    if variant != VARIANTS[2]:  # later steps take the path chosen here
        fused.ctx = None
    if variant == VARIANTS[0]:
        fused.head = None
    return e


def alternate(artifact: Path, steps: int) -> dict:
    ckpt = resolve(str(artifact))
    weights, scheme = load_weights(ckpt), kv_scheme(None, ckpt.config)
    c_argmax, torch_argmax = sampling.argmax, lambda x: int(x.argmax())

    def before(variant: str) -> None:  # the argmax in C only with the one-call step
        sampling.argmax = c_argmax if variant == VARIANTS[2] else torch_argmax

    fresh = {v: (lambda v=v: _engine(weights, scheme, v)) for v in VARIANTS}
    try:
        med = step_medians(fresh, steps, before)
    finally:
        sampling.argmax = c_argmax
    return {
        "artifact": artifact.name,
        "steps": steps,
        "ms_per_step": med,
        "speedup": {v: med[VARIANTS[0]] / med[v] for v in VARIANTS[1:]},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", default="qwen3_moe", help="comma-separated; '' for none")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()
    set_threads(args.threads)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        made = [family_artifact(Path(tmp), n) for n in args.families.split(",") if n]
        for artifact in [default_artifact(Path(tmp)), *made]:
            row = alternate(artifact, args.steps)
            rows.append(row)
            print(json.dumps(row), flush=True)
    save(
        args.out,
        "decode_step.json",
        f"python benchmarks/decode_step.py --families {args.families}",
        rows,
    )


if __name__ == "__main__":
    main()
