"""Decode with the weights in 4 KB pages against the same weights in 2 MB pages, one
process, steps alternating between the two, so that a noisy neighbour slows both alike.

Each artifact is loaded twice (LLMPRESS_HUGEPAGES=0, then 1) and each copy runs its own
engine: one sequence (32-token prompt, up to 300 out, restarted when done) or `--batch`
of them. Reported: median milliseconds per decode step of each, and their ratio. The
artifacts: the default model as runtime_speed.py makes it (rtn:w4g64, int8 lm_head),
benchmarks/families.py's realistic-width random models of `--families` at its recipe
(rtn:w4g64), and any given with --artifact.

    python benchmarks/hugepages.py [--families qwen2,qwen3_moe] [--artifact DIR ...]
        [--steps 2000] [--batch 1]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from interleave import running_engine, save, step_medians

from compress.kernels import hugepages
from compress.kernels.cpu import set_threads
from compress.model.loading import resolve
from compress.pipeline import compress
from compress.recipe import parse_recipe
from compress.runtime.kv_cache import kv_scheme
from compress.runtime.weights import load_weights

HERE = Path(__file__).resolve().parent


def default_artifact(work: Path) -> Path:
    out = work / "default-w4"
    recipe = parse_recipe({"stages": [{"rtn": {"bits": 4, "group_size": 64}}], "lm_head": "w8"})
    compress("default", recipe, out, log=lambda _: None)
    return out


def family_artifact(work: Path, name: str) -> Path:
    import families

    src = families.write_model(work / f"{name}-src", name)
    out = work / f"{name}-w4"
    families.compress_cli(src, out)
    return out


def loaded(artifact: Path, huge: bool):
    os.environ["LLMPRESS_HUGEPAGES"] = "1" if huge else "0"
    hugepages.available.cache_clear()
    try:
        return load_weights(resolve(str(artifact)))
    finally:
        os.environ.pop("LLMPRESS_HUGEPAGES")
        hugepages.available.cache_clear()


def alternate(artifact: Path, steps: int, batch: int) -> dict:
    ckpt = resolve(str(artifact))
    scheme = kv_scheme(None, ckpt.config)
    weights = {"4 KB pages": loaded(artifact, False), "2 MB pages": loaded(artifact, True)}
    fresh = {k: (lambda w=w: running_engine(w, scheme, batch)) for k, w in weights.items()}
    med = step_medians(fresh, steps)
    return {
        "artifact": artifact.name,
        "batch": batch,
        "steps": steps,
        "ms_per_step": med,
        "weights_MB_per_step": weights["2 MB pages"].step_bytes / 1e6,
        "speedup": med["4 KB pages"] / med["2 MB pages"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", default="qwen2,qwen3_moe", help="comma-separated; '' for none")
    ap.add_argument("--artifact", type=Path, action="append", default=[])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()
    if not hugepages.available():
        raise SystemExit("this system gives no transparent huge pages: nothing to compare")
    set_threads(args.threads)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        made = [family_artifact(Path(tmp), n) for n in args.families.split(",") if n]
        for artifact in [default_artifact(Path(tmp)), *made, *args.artifact]:
            row = alternate(artifact, args.steps, args.batch)
            rows.append(row)
            print(json.dumps(row), flush=True)
    save(
        args.out,
        "hugepages.json",
        f"python benchmarks/hugepages.py --families {args.families}"
        + "".join(f" --artifact {a.name}" for a in args.artifact),
        rows,
    )


if __name__ == "__main__":
    main()
