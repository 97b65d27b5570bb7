"""Symmetric against zero-point 4-bit RTN (groups of 64) on the default model: what the
symmetric default costs, and which symmetric scale rule costs least.

Every linear of every block is fake-quantized in place (round to nearest, per group of
64) and the drift measured against the fp32 original on WikiText-2 test windows of 512
tokens (../shared/guide/MEASURING.md); all rows side by side in one run.
Rows: zp (min-max with zero point); sym7 / sym75 / sym8: scale = max|w| / 7, 7.5, 8 with
integers clamped to [-8, 7]; "-mse": the per-group scale shrink that minimizes the
weight MSE on a grid.

    python benchmarks/zero_point.py [--windows 16] [--modes zp,sym7,sym75,...]
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import torch

from compress.artifact.dense import load_model
from compress.calib_data import eval_windows, read_texts, token_stream
from compress.eval.drift import format_table, measure_drift
from compress.model.loading import load_tokenizer, resolve

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "wikitext-2-raw" / "test.txt"


def fake_quant(w: torch.Tensor, group: int, mode: str, bits: int = 4) -> torch.Tensor:
    o, i = w.shape
    x = w.float().reshape(o, i // group, group)
    qmax = 2 ** (bits - 1) - 1
    qmin = -qmax - 1
    if mode == "zp":
        lo = x.amin(-1, keepdim=True).clamp(max=0)
        hi = x.amax(-1, keepdim=True).clamp(min=0)
        s = ((hi - lo) / (qmax - qmin)).clamp(min=1e-12)
        z = torch.round(qmin - lo / s)
        return ((torch.round(x / s) + z).clamp(qmin, qmax) - z).mul(s).reshape(o, i)
    div = {"sym7": qmax, "sym75": (qmax - qmin) / 2, "sym8": -qmin}[mode.split("-")[0]]
    amax = x.abs().amax(-1, keepdim=True).clamp(min=1e-12)
    shrinks = torch.linspace(1.0, 0.7, 16) if mode.endswith("-mse") else [1.0]
    best = best_err = None
    for shrink in shrinks:
        s = amax * shrink / div
        d = torch.round(x / s).clamp(qmin, qmax) * s
        err = (d - x).pow(2).sum(-1, keepdim=True)
        if best is None:
            best, best_err = d, err
        else:
            better = err < best_err
            best, best_err = torch.where(better, d, best), torch.where(better, err, best_err)
    return best.reshape(o, i)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--windows", type=int, default=64)
    ap.add_argument("--modes", default="zp,sym7,sym75,sym8,sym75-mse,sym7-mse")
    ap.add_argument("--data", type=Path, default=DATA)
    args = ap.parse_args()
    ckpt = resolve("default")
    base = load_model(ckpt)
    tokens = token_stream(load_tokenizer(ckpt), read_texts(str(args.data)))
    windows = eval_windows(tokens, 512, args.windows)
    candidates = {}
    for mode in args.modes.split(","):
        model = copy.deepcopy(base)
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and "layers." in name:
                module.weight.data = fake_quant(module.weight.data, 64, mode)
        candidates[mode] = model
    print(format_table(measure_drift(base, candidates, windows, data=args.data.name)))


if __name__ == "__main__":
    main()
