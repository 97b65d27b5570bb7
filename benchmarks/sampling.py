"""What choosing tokens costs a decode step: greedy and temperature-1 sampling, the step's
rows chosen in one C call (sampling.sample_rows, what the engine runs) and row by row (what
it ran before: per-row argmax, and for sampling the float64 tempered exponentials drawn
by their inverse cumulative, sampling.draw, or by torch.multinomial, the draw before that;
with top-p 0.9, torch's sort of the vocabulary),
steps alternating in one process so that a noisy neighbour slows all alike. Each engine
decodes `batch` sequences (32-token prompts, up to 300 out, restarted when done), every
sampled sequence with its own seeded generator as `serve` gives a request with a seed.
The artifact: the default model as runtime_speed.py makes it (rtn:w4g64, int8 lm_head). A
request that names no temperature is sampled at 1.0 by `serve`, as OpenAI's API does, so
this is what a default request costs.

    python benchmarks/sampling.py [--batches 1,8,32] [--steps 300]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hugepages import default_artifact
from interleave import running_engine, save, step_medians

from compress.kernels.cpu import set_threads
from compress.model.loading import resolve
from compress.runtime import engine, sampling
from compress.runtime.kv_cache import kv_scheme
from compress.runtime.weights import load_weights

HERE = Path(__file__).resolve().parent
DRAW, ONE_CALL, IN_C = sampling.draw, engine.sample_rows, sampling._in_c


def row_by_row(logits, params, generators) -> list:
    """No row in one call: each through the engine's _emit alone, as before."""
    return [None] * len(params)


def multinomial(probs: torch.Tensor, generator) -> int:
    return int(torch.multinomial(probs, 1, generator=generator))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()
    set_threads(args.threads)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        artifact = default_artifact(Path(tmp))
        ckpt = resolve(str(artifact))
        scheme, weights = kv_scheme(None, ckpt.config), load_weights(ckpt)
        for batch in (int(b) for b in args.batches.split(",")):
            fresh = {
                "greedy, one call": lambda b=batch: running_engine(weights, scheme, b),
                "greedy, row by row": lambda b=batch: running_engine(weights, scheme, b),
                "sampled, one call": lambda b=batch: running_engine(weights, scheme, b, 1),
                "sampled, row by row": lambda b=batch: running_engine(weights, scheme, b, 1),
                "sampled, row by row, torch.multinomial": lambda b=batch: running_engine(
                    weights, scheme, b, 1
                ),
                "top-p 0.9, one call": lambda b=batch: running_engine(weights, scheme, b, 1, 0.9),
                "top-p 0.9, row by row": lambda b=batch: running_engine(weights, scheme, b, 1, 0.9),
            }

            def before(name: str) -> None:
                rows = "row by row" in name
                engine.sample_rows = row_by_row if rows else ONE_CALL
                sampling._in_c = (lambda *_: False) if rows else IN_C
                sampling.draw = multinomial if name.endswith("multinomial") else DRAW

            med = step_medians(fresh, args.steps, before)
            before("")
            row = {
                "batch": batch,
                "steps": args.steps,
                "ms_per_step": med,
                "greedy_speedup": med["greedy, row by row"] / med["greedy, one call"],
                "sampled_speedup": med["sampled, row by row"] / med["sampled, one call"],
                "sampled_over_greedy": med["sampled, one call"] / med["greedy, one call"],
                "before_over_greedy": med["sampled, row by row"] / med["greedy, row by row"],
                "top_p_speedup": med["top-p 0.9, row by row"] / med["top-p 0.9, one call"],
                "top_p_over_greedy": med["top-p 0.9, one call"] / med["greedy, one call"],
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    save(
        args.out,
        "sampling.json",
        f"python benchmarks/sampling.py --batches {args.batches} --steps {args.steps}",
        rows,
    )


if __name__ == "__main__":
    main()
