"""Does mixed precision's sensitivity estimate rank linears as measured KL does? (issue 16)

For a spread of the default model's linears (every projection kind in several layers),
quantize that one linear alone (RTN, the scheme given) and measure the KL divergence to
the original on WikiText-2 test.txt windows; compare with the estimate mixed precision
uses, ½ Σ F (W − Q(W))², F the Fisher diagonal from calibration samples of valid.txt
(compress/quantizers/mixed.py). Reports Spearman's rank correlation (what the allocation
needs: the order) and Pearson's on log values, and the ratio estimate / measured.

    python benchmarks/sensitivity.py [--layers 0 5 10 15 20 25 29] [--scheme w4g64]
                                     [--fisher-samples 16] [--windows 8]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
from wikitext import DATA, require

from compress.artifact.dense import load_model
from compress.calib_data import calibration_samples, eval_windows, read_texts, token_stream
from compress.model.loading import load_tokenizer, resolve
from compress.quantizers.mixed import fisher_diagonal, parse_scheme
from compress.quantizers.scheme import QuantScheme, quantize_weight

HERE = Path(__file__).resolve().parent


def ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    for r, i in enumerate(order):
        out[i] = float(r)
    return out


def pearson(a: list[float], b: list[float]) -> float:
    x, y = torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
    x, y = x - x.mean(), y - y.mean()
    return float((x * y).sum() / (x.norm() * y.norm()))


@torch.no_grad()
def kl_to(base_logp: list[torch.Tensor], model, windows: torch.Tensor) -> float:
    total = 0.0
    for logp, ids in zip(base_logp, windows, strict=True):
        q = model(ids[None]).logits[0].float().log_softmax(-1)
        total += float((logp.exp() * (logp - q)).sum(-1).mean())
    return total / len(windows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, nargs="+", default=[0, 5, 10, 15, 20, 25, 29])
    ap.add_argument("--scheme", default="w4g64")
    ap.add_argument("--fisher-samples", type=int, default=16)
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()
    require(args.data)
    scheme = parse_scheme(args.scheme, QuantScheme(zero_point=False))
    ckpt = resolve("default")
    tokenizer = load_tokenizer(ckpt)
    model = load_model(ckpt).float().eval()
    adapter = ckpt.adapter
    names = [
        f"{adapter.block_prefix(i)}.{rel}" for i in args.layers for rel in adapter.block_linears
    ]
    valid = token_stream(tokenizer, read_texts(str(args.data / "valid.txt")))
    samples = calibration_samples(valid, args.fisher_samples, 512, seed=0)
    t0 = time.perf_counter()
    fisher = fisher_diagonal(model, samples, names, seed=0)
    fisher_s = time.perf_counter() - t0
    windows = eval_windows(token_stream(tokenizer, read_texts(str(args.data / "test.txt"))), 512)
    windows = windows[: args.windows]
    with torch.no_grad():
        base_logp = [model(ids[None]).logits[0].float().log_softmax(-1) for ids in windows]
    rows = {}
    for name in names:
        weight = model.get_submodule(name).weight
        original = weight.detach().clone()
        with torch.no_grad():
            quantized = quantize_weight(original, scheme, torch.float32).dequantize()
            estimate = 0.5 * float((fisher[name] * (quantized - original).square()).sum())
            weight.copy_(quantized)
            measured = kl_to(base_logp, model, windows)
            weight.copy_(original)
        rows[name] = {"estimated_kl": estimate, "measured_kl": measured}
        print(f"{name}: estimated {estimate:.5f}  measured {measured:.5f}", flush=True)
    est = [r["estimated_kl"] for r in rows.values()]
    mea = [r["measured_kl"] for r in rows.values()]
    summary = {
        "linears": len(rows),
        "spearman": round(pearson(ranks(est), ranks(mea)), 3),
        "pearson_log": round(pearson([math.log(v) for v in est], [math.log(v) for v in mea]), 3),
        "median_ratio": round(
            sorted(e / m for e, m in zip(est, mea, strict=True))[len(est) // 2], 3
        ),
        "fisher_seconds": round(fisher_s, 1),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    record = {
        "benchmark": "sensitivity",
        "scheme": scheme.label(),
        "fisher_samples": args.fisher_samples,
        "windows": args.windows,
        "summary": summary,
        "rows": rows,
    }
    (args.out / "sensitivity.json").write_text(json.dumps(record, indent=2) + "\n")
    lines = [
        f"# Sensitivity estimate vs measured KL ({scheme.label()}, one linear at a time)",
        "",
        f"`python benchmarks/sensitivity.py` — Fisher from {args.fisher_samples} × 512 tokens "
        f"of valid.txt, KL on {args.windows} × 512 tokens of test.txt.",
        "",
        f"Spearman rank correlation {summary['spearman']}, Pearson on logs "
        f"{summary['pearson_log']}, median estimate/measured {summary['median_ratio']} "
        f"over {summary['linears']} linears; Fisher pass {summary['fisher_seconds']} s.",
        "",
        "| linear | estimated KL | measured KL |",
        "|---|---|---|",
        *(f"| {n} | {r['estimated_kl']:.5f} | {r['measured_kl']:.5f} |" for n, r in rows.items()),
    ]
    (args.out / "sensitivity.md").write_text("\n".join(lines) + "\n")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
