"""Quality of KV-cache quantization through the runtime, at 2048-token context.

The fp32 original (transformers) is the reference; the candidates run in llmpress's
runtime with an fp32, KIVI int8 and KIVI int4 cache, for the fp32 model and for a w4
artifact (RTN g64, zero point). Each window is fed in chunks of 128 tokens, so every chunk
attends to the cache as stored. Also the KV bytes per token of each scheme.

    python benchmarks/kv_cache_drift.py [--windows 16] [--ctx 2048]
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
from compress.model.loading import load_tokenizer, resolve
from compress.pipeline import compress
from compress.recipe import parse_quant, parse_recipe
from compress.runtime.kv_cache import parse_kv
from compress.runtime.lm import RuntimeLM
from compress.runtime.weights import load_weights

HERE = Path(__file__).resolve().parent
DATA = HERE.parent.parent / "shared" / "data" / "wikitext-2-raw"
SCHEMES = ("none", "int8", "int4")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--windows", type=int, default=16)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()
    ckpt = resolve("default")
    tokenizer = load_tokenizer(ckpt)
    stream = token_stream(tokenizer, read_texts(str(args.data / "test.txt")))
    windows = eval_windows(stream, args.ctx, args.windows)
    candidates, extra = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        w4 = Path(tmp) / "w4"
        compress("default", parse_recipe({"stages": [parse_quant("rtn:w4g64")]}), w4, log=print)
        for model_name, source in (("fp32", "default"), ("w4 g64", str(w4))):
            weights = load_weights(resolve(source))
            for kv in SCHEMES:
                name = f"{model_name} weights, KV {'fp32' if kv == 'none' else kv}"
                lm = RuntimeLM(weights, args.ctx, kv=parse_kv(kv))
                candidates[name] = lm
                extra[name] = {"KV bytes/token": f"{lm.cache.bytes_per_token():.0f}"}
        results = measure_drift(load_model(ckpt), candidates, windows, data="test.txt")
    table = format_table(results, extra)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    record = {
        "benchmark": "kv_cache_drift",
        "machine": {"platform": platform.platform()},
        "ctx": args.ctx,
        "windows": args.windows,
        "chunk": 128,
        "results": {k: {**v.to_dict(), **extra[k]} for k, v in results.items()},
    }
    (args.out / "kv_cache_drift.json").write_text(json.dumps(record, indent=2) + "\n")
    (args.out / "kv_cache_drift.md").write_text(table + "\n")


if __name__ == "__main__":
    main()
