"""Dense weights at small batches: the C tiles (llmp_gemv_f32 / llmp_gemv_16) against
torch's products, and what that makes of `--calib self`'s text generation.

    python benchmarks/dense_rows.py [--rounds 5] [--name dense_rows]

Part 1 times one pass over the default model's linears (30 blocks of q/k/v, o, gate/up,
down, and the 49,152-word tied head; random weights of those shapes, fp32 and bf16) at
each row count, by the C tiles and by the route DenseLinear takes past gemv_rows
(torch's fp32 product; for bf16 a slice widened at a time, then torch's product), in
alternating rounds: medians of each.

Part 2 generates the default model's self-calibration text as `compress default` does
(its fp32 original, 16 samples of 128 tokens; and 32 samples, the batch the runtime
writes other presets' 128 and eval's 64 at) once through the C tiles and once with
DenseLinear sent to torch at every row count, alternating, and reports ms per step.

Set LLMPRESS_KERNEL_FLAGS to time another instruction set's build (e.g. "-O3 -mavx2 -mfma
-mf16c -fopenmp"), and MKL_ENABLE_INSTRUCTIONS=AVX2 to hold torch to the same.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from batched_decode import cpu_flags  # noqa: E402

from compress.kernels.cpu import gemv_f32, gemv_rows, sliced_product  # noqa: E402

BLOCK = [(1728, 576), (576, 576), (3072, 576), (576, 1536)]  # q/k/v, o, gate/up, down
SHAPES = BLOCK * 30 + [(49152, 576)]
ROWS = (1, 4, 8, 16, 32)


def torch_route(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """What DenseLinear computes past its C rows: torch's product, a 16-bit weight widened
    a slice at a time."""
    if w.dtype == torch.float32:
        return torch.nn.functional.linear(x, w)
    return sliced_product(x, *w.shape, lambda lo, hi, buf: buf.copy_(w[lo:hi]))


def one_pass(fn, weights, xs) -> float:
    start = time.perf_counter()
    for w in weights:
        fn(xs[w.shape[1]], w)
    return (time.perf_counter() - start) * 1e3


def kernel_rows(rounds: int) -> list[dict]:
    torch.manual_seed(0)
    out = []
    for dtype in (torch.float32, torch.bfloat16):
        weights = [torch.randn(s).to(dtype) for s in SHAPES]
        mb = sum(w.numel() * w.element_size() for w in weights) / 1e6
        for rows in ROWS:
            xs = {k: torch.randn(rows, k) for k in {s[1] for s in SHAPES}}
            for w in weights[:4]:  # the two routes compute the same products
                torch.testing.assert_close(
                    gemv_f32(xs[w.shape[1]], w), torch_route(xs[w.shape[1]], w), rtol=1e-4,
                    atol=1e-3,
                )  # fmt: skip
            times = {"C tiles": [], "torch": []}
            for _ in range(rounds + 1):  # the first round warms both
                times["C tiles"].append(one_pass(gemv_f32, weights, xs))
                times["torch"].append(one_pass(torch_route, weights, xs))
            c, t = (statistics.median(v[1:]) for v in times.values())
            row = {
                "dtype": str(dtype).removeprefix("torch."),
                "rows": rows,
                "weights_mb": round(mb, 1),
                "c_ms": round(c, 1),
                "torch_ms": round(t, 1),
                "torch / C": round(t / c, 2),
                "c_takes_it": rows <= gemv_rows(dtype),
            }
            print(row, flush=True)
            out.append(row)
    return out


def generation(rounds: int, n: int, length: int) -> dict:
    """ms per step of the default model's self-calibration text, C tiles against torch."""
    import compress.runtime.linears as linears
    from compress.model.default import convert_gguf, default_gguf
    from compress.model.loading import load_tokenizer, resolve
    from compress.runtime.calib_text import runtime_samples
    from compress.runtime.weights import load_weights

    ckpt = resolve(str(convert_gguf(default_gguf())))
    weights, tokenizer = load_weights(ckpt), load_tokenizer(ckpt)
    kept = linears.gemv_rows
    times = {"C tiles": [], "torch": []}
    runtime_samples(weights, tokenizer, n, 16, 0)  # warm
    for _ in range(rounds):
        for route in times:
            linears.gemv_rows = kept if route == "C tiles" else (lambda dtype: 0)
            start = time.perf_counter()
            runtime_samples(weights, tokenizer, n, length, 0)
            times[route].append((time.perf_counter() - start) / (length - 1) * 1e3)
    linears.gemv_rows = kept
    c, t = (statistics.median(v) for v in times.values())
    return {
        "samples": n,
        "tokens": length,
        "weights": "fp32, its GGUF's Q4_1 dequantized",
        "c_ms_per_step": round(c, 1),
        "torch_ms_per_step": round(t, 1),
        "torch / C": round(t / c, 2),
        "runs_ms": {k: [round(v, 1) for v in vs] for k, vs in times.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--generation-rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--name", default="dense_rows")
    args = ap.parse_args()
    command = "python benchmarks/dense_rows.py" + (
        f" --name {args.name}" if args.name != "dense_rows" else ""
    )
    names = ("LLMPRESS_KERNEL_FLAGS", "MKL_ENABLE_INSTRUCTIONS")
    env = {k: os.environ[k] for k in names if k in os.environ}
    if env:
        command = " ".join(f"{k}='{v}'" for k, v in env.items()) + " " + command
    record = {
        "command": command,
        "cpu": cpu_flags(),
        "threads": torch.get_num_threads(),
        "kernels": kernel_rows(args.rounds),
        "self_generation": generation(args.generation_rounds, 16, 128),
        "self_generation_32": generation(args.generation_rounds, 32, 128),
    }
    print(record["self_generation"], record["self_generation_32"], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
