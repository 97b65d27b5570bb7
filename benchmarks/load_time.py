"""How long an artifact takes to load into the runtime (what `bench` and `serve` wait for
before their first token): this checkout against an earlier git revision, in fresh
processes taking turns, so that a noisy neighbour slows both alike.

Each process imports llmpress from its own tree (the earlier one a git worktree), then
times `load_weights` alone: reading the safetensors, unpacking the codes and laying them
out for the C kernels, fusing q/k/v and gate/up. One untimed load per tree first builds
its kernels. Reported: median seconds of each tree per artifact, and their ratio.

    python benchmarks/load_time.py [--rev c953eac] [--artifacts LABEL=DIR,...] [--rounds 3]

Without --artifacts: the default model at rtn:w4g64 and benchmarks/families.py's qwen2_moe
row (realistic width, random weights) at its recipe.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from batched_decode import cpu_flags  # noqa: E402

CODE = """
import sys, time
from compress.model.loading import resolve
from compress.runtime.weights import load_weights
ckpt = resolve(sys.argv[1])
t = time.perf_counter()
load_weights(ckpt)
print(time.perf_counter() - t)
"""


def load_seconds(tree: Path, artifact: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", CODE, str(artifact)], env=env, cwd=tree,
                         capture_output=True, text=True, check=True)  # fmt: skip
    return float(out.stdout.split()[-1])


def default_artifacts(work: Path) -> list[Path]:
    from hugepages import family_artifact

    default = work / "default-rtn-w4g64"
    subprocess.run([sys.executable, "-m", "compress", "compress", "default", "-o", str(default),
                    "--quant", "rtn:w4g64"], check=True, capture_output=True)  # fmt: skip
    return [default, family_artifact(work, "qwen2_moe")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", default="c953eac", help="the earlier revision")
    ap.add_argument(
        "--change",
        default="int4/int8 codes unpacked as bytes, laid out for the kernels in C, and fused "
        "parts of whole tiles joined as they are (the earlier: int64 shifts, torch pads and "
        "permutes, and every fused linear unpacked and laid out again)",
    )
    ap.add_argument("--artifacts", default="")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "load_time.json")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        earlier = tmp / "earlier"
        subprocess.run(["git", "worktree", "add", "-q", "--detach", str(earlier), args.rev],
                       cwd=ROOT, check=True)  # fmt: skip
        try:
            named = [a.rpartition("=") for a in args.artifacts.split(",") if a]
            arts = [Path(path) for _, _, path in named] or default_artifacts(tmp)
            labels = [label or Path(path).name for label, _, path in named] or [
                "default model rtn:w4g64", "families.py qwen2_moe row"]  # fmt: skip
            trees = {"earlier": earlier, "now": ROOT}
            for tree in trees.values():
                load_seconds(tree, arts[0])  # builds its kernels
            rows = []
            for art, label in zip(arts, labels, strict=True):
                runs = {name: [] for name in trees}
                for r in range(args.rounds):
                    for name in list(trees) if r % 2 == 0 else list(trees)[::-1]:
                        runs[name].append(load_seconds(trees[name], art))
                med = {name: statistics.median(v) for name, v in runs.items()}
                size = sum(f.stat().st_size for f in art.iterdir()) / 1e9
                row = {"artifact": label, "artifact_gb": round(size, 2),
                       "seconds": {k: round(v, 2) for k, v in med.items()}, "runs": runs,
                       "earlier / now": round(med["earlier"] / med["now"], 2)}  # fmt: skip
                print(json.dumps(row), flush=True)
                rows.append(row)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(earlier)], cwd=ROOT)
    record = {"command": "python benchmarks/load_time.py " + " ".join(sys.argv[1:]),
              "cpu": cpu_flags(), "threads": os.cpu_count(), "rev": args.rev,
              "change": args.change, "rows": rows}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
