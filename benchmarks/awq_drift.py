"""AWQ against RTN on the default model: drift, bits per weight and time, in one run.

Protocol (issue #3, ../shared/guide/MEASURING.md): calibrate on wikitext-2 raw valid.txt
(128 samples × 512 tokens), evaluate on test.txt read whole, the first 64 windows of 512
tokens, against the fp32 original; every row compared with the same original logits.

    python benchmarks/awq_drift.py [--windows 64] [--samples 128] [--schemes ...]
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

from wikitext import DATA, require

from compress.artifact.dense import load_model
from compress.calib_data import eval_windows, read_texts, token_stream
from compress.eval.drift import format_table, measure_drift
from compress.model.loading import load_tokenizer, resolve
from compress.pipeline import compress
from compress.recipe import parse_quant, parse_recipe

HERE = Path(__file__).resolve().parent
SCHEMES = ["rtn:w4g64zp", "rtn:w4g32zp", "awq:w4g64zp", "rtn:w3g64zp", "awq:w3g64zp"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--windows", type=int, default=64)
    ap.add_argument("--samples", type=int, default=128)
    ap.add_argument("--length", type=int, default=512)
    ap.add_argument("--schemes", nargs="+", default=SCHEMES)
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()
    require(args.data)

    base_ckpt = resolve("default")
    tokenizer = load_tokenizer(base_ckpt)
    calib = {"source": str(args.data / "valid.txt"), "samples": args.samples, "length": args.length}
    candidates, extra, timing = {}, {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for spec in args.schemes:
            out = Path(tmp) / spec.replace(":", "-")
            recipe = parse_recipe({"stages": [parse_quant(spec)], "calib": calib})
            t0 = time.perf_counter()
            compress("default", recipe, out, log=print)
            seconds = time.perf_counter() - t0
            manifest = json.loads((out / "manifest.json").read_text())
            candidates[spec] = load_model(resolve(str(out)))
            extra[spec] = {
                "bits/weight": manifest["weights"]["bits_per_quantized_weight"],
                "compress s": f"{seconds:.0f}",
            }
            timing[spec] = {**manifest["timing_s"], **manifest["stages"][0].get("seconds", {})}
        base = load_model(base_ckpt)
        stream = token_stream(tokenizer, read_texts(str(args.data / "test.txt")))
        windows = eval_windows(stream, 512, args.windows)
        results = measure_drift(base, candidates, windows, data="test.txt")

    table = format_table(results, extra)
    print(f"original: ppl {next(iter(results.values())).base_ppl:.3f}")
    print(table)
    print(json.dumps(timing, indent=2))
    args.out.mkdir(parents=True, exist_ok=True)
    record = {
        "benchmark": "awq_drift",
        "machine": {"platform": platform.platform()},
        "calibration": calib | {"source": "valid.txt"},
        "windows": args.windows,
        "results": {k: {**v.to_dict(), **extra[k]} for k, v in results.items()},
        "timing_s": timing,
    }
    (args.out / "awq_drift.json").write_text(json.dumps(record, indent=2) + "\n")
    (args.out / "awq_drift.md").write_text(table + "\n")


if __name__ == "__main__":
    main()
