"""RTN on the default model: drift, size and time to compress, all measured in one run.

Protocol (../shared/guide/MEASURING.md): original = the default model in fp32; evaluation
text = wikitext-2 raw test.txt read whole, windows of 512 tokens, the first 64 (32,704
scored tokens). Every candidate is compared with the same original logits, window by
window, so the ratios between rows are measured side by side.

    python benchmarks/rtn_drift.py [--windows 64] [--data PATH] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

from compress.artifact.dense import load_model
from compress.calib_data import eval_windows, read_texts, token_stream
from compress.eval.drift import format_table, measure_drift
from compress.model.loading import load_tokenizer, resolve
from compress.pipeline import compress
from compress.recipe import parse_quant, parse_recipe

HERE = Path(__file__).resolve().parent
DATA = HERE.parent.parent / "shared" / "data" / "wikitext-2-raw" / "test.txt"
SCHEMES = ["rtn:w4g32zp", "rtn:w4g64zp", "rtn:w4g128zp", "rtn:w4g64sym", "rtn:w8"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--windows", type=int, default=64)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()
    if not args.data.is_file():
        raise SystemExit(f"evaluation text not found: {args.data}")

    base_ckpt = resolve("default")
    base = load_model(base_ckpt)
    tokenizer = load_tokenizer(base_ckpt)
    windows = eval_windows(
        token_stream(tokenizer, read_texts(str(args.data))), args.ctx, args.windows
    )

    candidates, extra = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for spec in SCHEMES:
            out = Path(tmp) / spec.replace(":", "-")
            t0 = time.perf_counter()
            compress(
                "default", parse_recipe({"stages": [parse_quant(spec)]}), out, log=lambda _: None
            )
            seconds = time.perf_counter() - t0
            manifest = json.loads((out / "manifest.json").read_text())
            candidates[spec] = load_model(resolve(str(out)))
            extra[spec] = {
                "size MB": f"{manifest['sizes']['weights_bytes'] / 1e6:.1f}",
                "bits/weight": manifest["weights"]["bits_per_quantized_weight"],
                "compress s": f"{seconds:.1f}",
            }
        results = measure_drift(base, candidates, windows, data=str(args.data.name))

    base_mb = sum(f.stat().st_size for f in base_ckpt.files) / 1e6
    table = format_table(results, extra)
    print(f"original: ppl {next(iter(results.values())).base_ppl:.3f}, {base_mb:.1f} MB (fp32)")
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    record = {
        "benchmark": "rtn_drift",
        "machine": {"platform": platform.platform(), "processor": platform.processor()},
        "windows": args.windows,
        "ctx": args.ctx,
        "original_mb": base_mb,
        "results": {k: {**v.to_dict(), **extra[k]} for k, v in results.items()},
    }
    (args.out / "rtn_drift.json").write_text(json.dumps(record, indent=2) + "\n")
    (args.out / "rtn_drift.md").write_text(table + "\n")


if __name__ == "__main__":
    main()
