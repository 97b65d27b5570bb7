"""What the original's cache saves a second `llmpress eval`: wall time of a first eval
(the original computed block by block, then cached) and of a second one (its final
hidden states read from the cache), both as `eval` runs by default (the artifact as
served and its weights alone, two passes) and with `--exact` (one pass), each in a fresh
process with an empty cache folder of its own. The figures must agree to the bit.

    python benchmarks/eval_cache.py [--artifact DIR] [--windows 64] [--name eval_cache]

Without --artifact: the default model at the README's `--quant w4g64`, written first.
Reads WikiText-2 test from ../shared/data (fails when it is missing).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from batched_decode import cpu_flags  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "wikitext-2-raw" / "test.txt"


def run_eval(artifact: Path, cache: Path, windows: int, exact: bool) -> dict:
    """One `llmpress eval` process: its wall seconds and the result it wrote."""
    out = cache / "result.json"
    cmd = [sys.executable, "-m", "compress", "eval", str(artifact), "--data", str(DATA),
           "--windows", str(windows), "--no-record", "--json", str(out)]  # fmt: skip
    if exact:
        cmd.append("--exact")
    env = {**os.environ, "LLMPRESS_CACHE": str(cache)}
    t = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    wall = time.perf_counter() - t
    return {"wall_s": round(wall, 1), "result": json.loads(out.read_text())}


def shared_cache(into: Path) -> None:
    """The converted default model and calibration text, linked from the user's cache so
    that each run starts without an eval entry but converts nothing."""
    from compress.model.default import cache_dir

    into.mkdir(parents=True)
    for entry in cache_dir().iterdir() if cache_dir().is_dir() else ():
        if entry.name != "eval":
            (into / entry.name).symlink_to(entry)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--artifact", type=Path)
    ap.add_argument("--windows", type=int, default=64)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--name", default="eval_cache", help="the results' file name")
    args = ap.parse_args()
    if not DATA.is_file():
        raise SystemExit(f"{DATA} is missing: the benchmark evaluates on WikiText-2's test split")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        artifact = args.artifact
        if artifact is None:
            artifact = tmp / "smollm2-w4g64"
            subprocess.run([sys.executable, "-m", "compress", "compress", "default", "-o",
                            str(artifact), "--quant", "w4g64"], check=True,
                           capture_output=True)  # fmt: skip
        rows = []
        for exact in (False, True):
            cache = tmp / f"cache-{exact}"
            shared_cache(cache)
            first = run_eval(artifact, cache, args.windows, exact)
            second = run_eval(artifact, cache, args.windows, exact)
            a, b = first["result"], second["result"]
            if (a["reference"], b["reference"]) != ("computed", "cached") or a["kl"] != b["kl"]:
                raise SystemExit(f"the cached eval differs from the first: {a} / {b}")
            rows.append({
                "mode": "--exact" if exact else "default",
                "kernels": a["kernels"] + (" + exact" if a.get("weights_only") else ""),
                "first_s": first["wall_s"],
                "cached_s": second["wall_s"],
                "first / cached": round(first["wall_s"] / second["wall_s"], 2),
                "kl": [a["kl"], b["kl"]],
                "kl_diff": abs(a["kl"] - b["kl"]),
                "tokens": a["tokens"],
            })  # fmt: skip
            print(rows[-1], flush=True)
    record = {
        "command": "python benchmarks/eval_cache.py"
        + ("" if args.artifact is None else " --artifact DIR")
        + ("" if args.windows == 64 else f" --windows {args.windows}")
        + ("" if args.name == "eval_cache" else f" --name {args.name}"),
        "artifact": "default model, --quant w4g64" if args.artifact is None else str(artifact),
        "windows": args.windows,
        "ctx": 512,
        "cpu": cpu_flags(),
        "threads": os.cpu_count(),
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
