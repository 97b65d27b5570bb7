"""Group scales: min-max against the importance-weighted search, with RTN and with GPTQ.

A quick screen, not the quality protocol: every linear of the default model is rounded
at once from the fp32 original's own inputs (no block-by-block walk), with statistics from
16 × 512 tokens of WikiText-2 valid.txt, and the drift is measured on the first
`--windows` windows of test.txt. It isolates what the scale choice does; the pipeline's
figures are benchmarks/quality.py's.

    python benchmarks/scale_search.py [--windows 16]

Rows: `rtn` (min-max), `rtn+search` (scale_search.py against E[x²]), `gptq` (act_order,
min-max static groups), `gptq+search` (the default), `gptq+pick` (each row keeps whichever
of the two GPTQ results leaves less GPTQ loss on the calibration inputs: tried, worse).
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import torch
from wikitext import DATA, require

from compress.artifact.dense import load_model
from compress.calib_data import eval_windows, read_texts, token_stream
from compress.eval.drift import format_table, measure_drift
from compress.model.loading import load_tokenizer, resolve
from compress.quantizers.gptq import gptq_quantize
from compress.quantizers.scale_search import search_qparams
from compress.quantizers.scheme import QuantScheme, compute_qparams, dequantize, quantize_with

HERE = Path(__file__).resolve().parent
SCHEME = QuantScheme(4, 64, False)


def _rounded(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return dequantize(quantize_with(w, scale, None, SCHEME, 64), scale, None, 64)


def _pick(w: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """Per row, the GPTQ result with less loss (ΔW H ΔWᵀ) on the calibration inputs."""
    out = []
    for search in (False, True):
        wq = gptq_quantize(w, h, SCHEME, torch.float32, True, scale_search=search).dequantize()
        out.append((wq, ((wq - w) @ h * (wq - w)).sum(1)))
    (a, la), (b, lb) = out
    return torch.where((lb < la)[:, None], b, a)


METHODS = {
    "rtn": lambda w, h: _rounded(w, compute_qparams(w, SCHEME, 64, torch.float32)[0]),
    "rtn+search": lambda w, h: _rounded(
        w, search_qparams(w, SCHEME, 64, torch.float32, torch.diagonal(h))[0]
    ),
    "gptq": lambda w, h: gptq_quantize(w, h, SCHEME, torch.float32, True).dequantize(),
    "gptq+search": lambda w, h: gptq_quantize(
        w, h, SCHEME, torch.float32, True, scale_search=True
    ).dequantize(),
    "gptq+pick": _pick,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--windows", type=int, default=16)
    ap.add_argument("--rows", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()
    require(args.data)
    ckpt = resolve("default")
    tokenizer = load_tokenizer(ckpt)
    base = load_model(ckpt)
    windows = eval_windows(token_stream(tokenizer, read_texts(str(args.data / "test.txt"))), 512)
    calib = eval_windows(token_stream(tokenizer, read_texts(str(args.data / "valid.txt"))), 512)
    linears = [
        n for n, m in base.named_modules() if isinstance(m, torch.nn.Linear) and "lm_head" not in n
    ]
    sums: dict[str, list] = {}

    def hook(name):
        def observe(module, inputs, output):
            x = inputs[0].detach().reshape(-1, inputs[0].shape[-1]).double()
            s = sums.setdefault(name, [0, 0])
            s[0], s[1] = s[0] + x.T @ x, s[1] + x.shape[0]

        return observe

    handles = [base.get_submodule(n).register_forward_hook(hook(n)) for n in linears]
    with torch.no_grad():
        for window in calib[:16]:
            base(window[None])
    for h in handles:
        h.remove()
    hessians = {n: (2 * s / count).float() for n, (s, count) in sums.items()}
    results, extra = {}, {}
    for row in args.rows:
        started = time.perf_counter()
        model = copy.deepcopy(base)
        with torch.no_grad():
            for n in linears:
                lin = model.get_submodule(n)
                lin.weight.copy_(METHODS[row](lin.weight.float(), hessians[n]))
        extra[row] = {"seconds": f"{time.perf_counter() - started:.0f}"}
        results.update(measure_drift(base, {row: model}, windows[: args.windows], data="test.txt"))
        print(row, results[row].to_dict(), extra[row], flush=True)
    table = format_table(results, extra)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    record = {
        "benchmark": "scale_search",
        "calibration": {"source": "valid.txt", "samples": 16, "length": 512},
        "windows": args.windows,
        "results": {k: {**v.to_dict(), **extra[k]} for k, v in results.items()},
    }
    (args.out / "scale_search.json").write_text(json.dumps(record, indent=1))
    (args.out / "scale_search.md").write_text(table + "\n")


if __name__ == "__main__":
    main()
