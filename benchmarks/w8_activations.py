"""What two-term int8 activations cost 8-bit layers in speed, against one term.

8-bit weights read their activations as two int8 terms (the codes and the rounded
residual, compress/kernels/cpu.py SPLIT_W8): served drift then equals the weights' own
(benchmarks/served_drift.py). The two terms run as one batch of twice the rows, so the
weights are still read once a step; the cost is arithmetic, which grows with the batch.
This decodes the default model's rtn:w8 artifact, and rtn:w4g64 with an 8-bit lm_head
(the default for an untied head), at each batch with the split on and off, interleaved,
`--rounds` times, and reports the median tokens/s, prefill tokens/s and their ratios.

    python benchmarks/w8_activations.py [--batches 1,8,32] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
from pathlib import Path

import torch

from compress.kernels import cpu
from compress.model.loading import resolve
from compress.pipeline import compress
from compress.recipe import parse_quant, parse_recipe
from compress.runtime import load_weights
from compress.runtime.bench import bench_one, measure_bandwidth, measure_matmul_flops

HERE = Path(__file__).resolve().parent
WORK = HERE / "work" / "w8_activations"
ARTIFACTS = {"rtn:w8": {}, "rtn:w4g64 + lm_head w8": {"lm_head": "w8"}}


def _artifact(label: str, extra: dict) -> Path:
    out = WORK / label.replace(":", "-").replace(" ", "").replace("+", "_")
    if not (out / "manifest.json").is_file():
        spec = label.split(" ")[0]
        recipe = parse_recipe({"stages": [parse_quant(spec)], **extra})
        compress("default", recipe, out, overwrite=True, log=lambda _: None)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=32)
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    bandwidth, flops = measure_bandwidth(), measure_matmul_flops()
    rows = {}
    for label, extra in ARTIFACTS.items():
        weights = load_weights(resolve(str(_artifact(label, extra))))
        runs: dict[tuple[int, bool], list] = {}
        for _ in range(args.rounds):
            for batch in batches:
                for split in (True, False):
                    cpu.SPLIT_W8 = split  # read when each engine packs its one-call layers
                    r = bench_one(
                        weights, batch, args.prompt_len, args.output_len, bandwidth, flops
                    )
                    runs.setdefault((batch, split), []).append(r)
        cpu.SPLIT_W8 = True
        for batch in batches:
            on, off = runs[(batch, True)], runs[(batch, False)]
            decode = [statistics.median(r.tokens_per_s for r in rs) for rs in (on, off)]
            prefill = [statistics.median(r.prefill_tokens_per_s for r in rs) for rs in (on, off)]
            rows[f"{label}, batch {batch}"] = {
                "decode_tok_s": {"two terms": decode[0], "one term": decode[1]},
                "decode_ratio": decode[0] / decode[1],
                "prefill_tok_s": {"two terms": prefill[0], "one term": prefill[1]},
                "prefill_ratio": prefill[0] / prefill[1],
            }
            print(f"{label}, batch {batch}: {json.dumps(rows[f'{label}, batch {batch}'])}")
    record = {
        "benchmark": "w8_activations",
        "command": f"python benchmarks/w8_activations.py --batches {args.batches} "
        f"--rounds {args.rounds}",
        "machine": platform.machine(),
        "threads": torch.get_num_threads(),
        "prompt_len": args.prompt_len,
        "output_len": args.output_len,
        "results": rows,
    }
    (HERE / "results" / "w8_activations.json").write_text(json.dumps(record, indent=2) + "\n")
    print("docs/results.md renders it: python scripts/results_doc.py")


if __name__ == "__main__":
    main()
