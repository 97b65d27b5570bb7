"""What storing the default model in 16 bits costs in quality, before any quantization.

The default checkpoint is float32 only because transformers dequantizes its GGUF into
float32; `dtype: auto16` (the best:* presets) stores such a checkpoint's dense tensors
and scales in bfloat16. This rounds every parameter of the fp32 original to bfloat16 and
to float16 and measures the drift of each against the original with the protocol of
../shared/guide/MEASURING.md (64 windows of 512 tokens of WikiText-2 test.txt).

    python benchmarks/storage_dtype.py [--windows 64]
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import torch
from wikitext import DATA, require

from compress.artifact.dense import load_model
from compress.calib_data import eval_windows, read_texts, token_stream
from compress.eval.drift import format_table, measure_drift
from compress.model.loading import load_tokenizer, resolve

HERE = Path(__file__).resolve().parent


@torch.no_grad()
def rounded(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A copy of `model` whose parameters hold only values `dtype` can store."""
    out = copy.deepcopy(model)
    for p in out.parameters():
        p.copy_(p.to(dtype).float())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--windows", type=int, default=64)
    ap.add_argument("--data", type=Path, default=DATA)
    args = ap.parse_args()
    require(args.data, "test.txt")
    ckpt = resolve("default")
    base = load_model(ckpt)
    stream = token_stream(load_tokenizer(ckpt), read_texts(str(args.data / "test.txt")))
    windows = eval_windows(stream, 512, args.windows)
    models = {name: rounded(base, getattr(torch, name)) for name in ("bfloat16", "float16")}
    results = measure_drift(base, models, windows, data="test.txt")
    table = format_table(results, {})
    record = {"windows": args.windows, "results": {k: v.to_dict() for k, v in results.items()}}
    (HERE / "results" / "storage_dtype.json").write_text(json.dumps(record, indent=2) + "\n")
    (HERE / "results" / "storage_dtype.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
