"""Outlier-aware int8 against plain int8, on the default model and on an amplified one.

Protocol: calibrate on wikitext-2 raw valid.txt (32 × 512 tokens: the per-channel maxima
need no more), evaluate on test.txt
(first 64 windows of 512 tokens) against the fp32 original. The amplified model is the
default model with a few hidden channels of every norm's output multiplied by a large
factor and the weight columns that read them divided by it (compress/model/amplify.py):
the same function, now with activation outliers; its rows are compared with the same
fp32 original.

    python benchmarks/int8_outliers.py [--windows 64] [--samples 128] [--factor 100]
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
from pathlib import Path

from compress.artifact.dense import load_model
from compress.calib_data import eval_windows, read_texts, token_stream
from compress.eval.drift import format_table, measure_drift
from compress.model.amplify import amplify_checkpoint
from compress.model.loading import load_tokenizer, resolve
from compress.pipeline import compress
from compress.recipe import parse_recipe

HERE = Path(__file__).resolve().parent
DATA = HERE.parent.parent / "shared" / "data" / "wikitext-2-raw"
CHANNELS = [17, 101, 333, 480]  # amplified hidden channels (any few would do)

RTN = {"rtn": {"bits": 8, "group_size": None, "zero_point": False}}
DEFAULT_ROWS = {
    "int8 per-channel RTN": RTN,
    "int8 outliers t=6": {"int8": {"threshold": 6.0}},
    "int8 outliers t=3": {"int8": {"threshold": 3.0}},
    "int8 outliers top 1%": {"int8": {"fraction": 0.01}},
    "int8 g64 outliers t=6": {"int8": {"threshold": 6.0, "group_size": 64}},
    "int8 g64 outliers top 1%": {"int8": {"fraction": 0.01, "group_size": 64}},
    "int8 outliers t=6 W8A8": {"int8": {"threshold": 6.0, "activations": "int8"}},
}
AMPLIFIED_ROWS = {
    "int8 per-channel RTN": RTN,
    "int8 outliers t=6": {"int8": {"threshold": 6.0}},
    "int8 outliers t=6 W8A8": {"int8": {"threshold": 6.0, "activations": "int8"}},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--windows", type=int, default=64)
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--length", type=int, default=512)
    ap.add_argument("--factor", type=float, default=100.0)
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()
    base_ckpt = resolve("default")
    tokenizer = load_tokenizer(base_ckpt)
    calib = {"source": str(args.data / "valid.txt"), "samples": args.samples, "length": args.length}
    candidates, extra = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        amplified = amplify_checkpoint(base_ckpt, Path(tmp) / "amplified", CHANNELS, args.factor)
        candidates["amplified fp32 (reparametrized)"] = load_model(resolve(str(amplified)))
        runs = (("default", "default", DEFAULT_ROWS), ("amplified", str(amplified), AMPLIFIED_ROWS))
        for model_name, model, rows in runs:
            for name, stage in rows.items():
                row = f"{model_name}: {name}"
                out = Path(tmp) / row.replace(" ", "_").replace(":", "").replace("=", "")
                compress(
                    model,
                    parse_recipe({"stages": [stage], "calib": calib}),
                    out,
                    log=lambda _: None,
                )
                manifest = json.loads((out / "manifest.json").read_text())
                record = manifest["stages"][0]
                share = record.get("outlier_share", 0.0)
                extra[row] = {"16-bit columns": f"{100 * share:.2f}%"}
                candidates[row] = load_model(resolve(str(out)))
                print(row, extra[row], flush=True)
        base = load_model(base_ckpt)
        stream = token_stream(tokenizer, read_texts(str(args.data / "test.txt")))
        windows = eval_windows(stream, 512, args.windows)
        results = measure_drift(base, candidates, windows, data="test.txt")
    table = format_table(results, extra)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    record = {
        "benchmark": "int8_outliers",
        "machine": {"platform": platform.platform()},
        "amplified": {"channels": CHANNELS, "factor": args.factor},
        "calibration": calib | {"source": "valid.txt"},
        "windows": args.windows,
        "results": {k: {**v.to_dict(), **extra.get(k, {})} for k, v in results.items()},
    }
    (args.out / "int8_outliers.json").write_text(json.dumps(record, indent=2) + "\n")
    (args.out / "int8_outliers.md").write_text(table + "\n")


if __name__ == "__main__":
    main()
