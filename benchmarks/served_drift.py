"""Drift as served against drift of the weights alone, for w4 and w8 artifacts.

`llmpress eval` measures what `bench` and `serve` run: on CPU every linear reads int8
activations (per block of 32), as decode does. `--exact` measures the weights alone (fp32
activations, dequantized weights), which is what transformers computes. This compresses
the default model with each recipe and evaluates both figures in one pass over the
protocol of ../shared/guide/MEASURING.md (64 windows of 512 tokens of WikiText-2
test.txt), so a user can see what a gate on the served figure costs.

    python benchmarks/served_drift.py [--recipes rtn:w4g64,rtn:w8] [--windows 64]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

from wikitext import DATA, require

from compress.eval.run import evaluate
from compress.pipeline import compress
from compress.recipe import recipe_from_flags

HERE = Path(__file__).resolve().parent
WORK = HERE / "work" / "served_drift"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipes", default="rtn:w4g64,gptq:w4g64,rtn:w8")
    ap.add_argument("--windows", type=int, default=64)
    ap.add_argument("--data", type=Path, default=DATA)
    args = ap.parse_args()
    require(args.data, "test.txt")
    calib = {"source": str(args.data / "valid.txt"), "samples": 128, "length": 512}
    rows = {}
    for spec in args.recipes.split(","):
        out = WORK / spec.replace(":", "-")
        recipe = recipe_from_flags(None, spec, calib, {}, (), None)
        started = time.perf_counter()
        compress("default", recipe, out, overwrite=True, log=lambda _: None)
        made = time.perf_counter() - started
        drift = evaluate(
            str(out), "default", str(args.data / "test.txt"), 512, args.windows, record=False
        )
        exact = drift.weights_only
        rows[spec] = {
            "served": {k: drift.to_dict()[k] for k in ("ppl", "kl", "top1")},
            "exact": {k: exact[k] for k in ("ppl", "kl", "top1")},
            "compress_s": round(made, 1),
        }
        print(spec, json.dumps(rows[spec]), flush=True)
    lines = [
        "| recipe | KL as served | KL weights only | top-1 as served | top-1 weights only |",
        "|---|---|---|---|---|",
    ]
    for spec, r in rows.items():
        s, e = r["served"], r["exact"]
        lines.append(
            f"| {spec} | {s['kl']:.4f} | {e['kl']:.4f} | {s['top1']:.4f} | {e['top1']:.4f} |"
        )
    record = {
        "protocol": f"{args.windows} windows x 512 tokens of test.txt; calibration 128 x 512 "
        "of valid.txt",
        "machine": platform.processor() or platform.machine(),
        "results": rows,
    }
    (HERE / "results" / "served_drift.json").write_text(json.dumps(record, indent=2) + "\n")
    (HERE / "results" / "served_drift.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
