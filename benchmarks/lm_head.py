"""What quantizing the output projection costs, on the default model: RTN w4g64 blocks with
the lm_head kept 16/32-bit (tied to the embedding, as the model ships), in int8 per
channel (w8), or in 4 bits (w4g64, w4g128). This is what `--lm-head`'s default is chosen
from: an untied head in full precision is most of a small model's decode bytes (545 of
770 MB a step for Qwen2.5-0.5B's shape), and llama.cpp's Q4_0 stores it in Q6_K.

Protocol as benchmarks/rtn_drift.py (../shared/guide/MEASURING.md): wikitext-2 raw
test.txt, windows of 512 tokens, the first `--windows`; every candidate against the same
fp32 original logits, window by window.

    python benchmarks/lm_head.py [--windows 32] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from wikitext import default_model_windows

from compress.artifact.dense import load_model
from compress.eval.drift import format_table, measure_drift
from compress.model.loading import resolve
from compress.pipeline import compress
from compress.recipe import parse_quant, parse_recipe

HERE = Path(__file__).resolve().parent
DATA = HERE.parent.parent / "shared" / "data" / "wikitext-2-raw" / "test.txt"
HEADS = [None, "w8", "w4g128", "w4g64"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--windows", type=int, default=32)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()
    base, windows = default_model_windows(args.data, args.ctx, args.windows)
    candidates, extra = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for head in HEADS:
            label = f"rtn:w4g64, lm_head {head or 'tied, unquantized'}"
            out = Path(tmp) / (head or "none")
            recipe = {"stages": [parse_quant("rtn:w4g64")], **({"lm_head": head} if head else {})}
            compress("default", parse_recipe(recipe), out, log=lambda _: None)
            manifest = json.loads((out / "manifest.json").read_text())
            candidates[label] = load_model(resolve(str(out)))
            extra[label] = {"size MB": f"{manifest['sizes']['weights_bytes'] / 1e6:.1f}"}
        results = measure_drift(base, candidates, windows, data=str(args.data.name))
    table = format_table(results, extra)
    print(table)
    record = {
        "benchmark": "lm_head",
        "command": "python benchmarks/lm_head.py",
        "windows": args.windows,
        "ctx": args.ctx,
        "results": {k: {**v.to_dict(), **extra[k]} for k, v in results.items()},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "lm_head.json").write_text(json.dumps(record, indent=2) + "\n")
    (args.out / "lm_head.md").write_text(table + "\n")


if __name__ == "__main__":
    main()
