"""Structured pruning and distillation repair on the default model, in one run.

Prunes SmolLM2-135M to about 70% of its non-embedding parameters and measures, on
WikiText-2 test (ctx 512, first 64 windows) against the fp32 original:
  - activation-based pruning (`split: auto`), without repair and with repair;
  - random pruning to the same shape, without and with the same repair budget;
  - depth-only pruning (whole layers, ranked by removal KL) to the same parameter count.
Calibration (importance) and distillation text: WikiText-2 valid, never the test text.
Every artifact is made by the `llmpress compress` command, one process each, so the
distillation's peak memory (max RSS) is its own. Then decode speed at batch 1 of the
original and the pruned model, fp32 and w4 (RTN g64 + int8 lm_head), in the runtime.

    python benchmarks/pruning.py [--tokens 180000] [--windows 64]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import yaml

from compress.artifact.dense import load_model
from compress.artifact.manifest import read_manifest
from compress.calib_data import eval_windows, read_texts, token_stream
from compress.eval.drift import format_table, measure_drift
from compress.model.loading import load_tokenizer, resolve
from compress.runtime.bench import bench_one, measure_bandwidth, measure_matmul_flops
from compress.runtime.lm import RuntimeLM
from compress.runtime.weights import load_weights

HERE = Path(__file__).resolve().parent
DATA = HERE.parent.parent / "shared" / "data" / "wikitext-2-raw"


def llmpress(*args: str) -> None:
    cmd = [sys.executable, "-m", "compress", *args]
    print("$ llmpress " + " ".join(args), flush=True)
    subprocess.run(cmd, check=True)


def make(work: Path, name: str, recipe: dict) -> Path:
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    out = work / name
    llmpress("compress", "default", "-o", str(out), "--recipe", str(path), "--overwrite")
    return out


def _portable(value) -> str:
    """A path as the repository sees it (results are committed; absolute paths are not
    anyone else's)."""
    if isinstance(value, Path):
        return os.path.relpath(value.resolve(), HERE.parent)
    return str(value)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=float, default=0.7, help="kept non-embedding fraction")
    ap.add_argument("--tokens", type=int, default=180_000, help="distillation token budget")
    ap.add_argument("--max-minutes", type=float, default=30.0)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--windows", type=int, default=64)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--calib-samples", type=int, default=32)
    ap.add_argument("--distill-samples", type=int, default=512)
    ap.add_argument("--repair-depth", action="store_true", help="also repair the depth baseline")
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--work", type=Path, default=HERE / "work" / "pruning")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    valid = str(args.data / "valid.txt")
    calib = {"source": valid, "samples": args.calib_samples, "length": args.ctx}
    distill = {
        "tokens": args.tokens,
        "max_minutes": args.max_minutes,
        "batch": args.batch,
        "lr": args.lr,
        "data": valid,
        "samples": args.distill_samples,
        "checkpoint_every": 25,
    }
    prune = {"params": args.params}
    arts = {
        "activation": make(args.work, "activation", {"stages": [{"prune": prune}], "calib": calib})
    }
    record = read_manifest(arts["activation"])["stages"][0]
    same_shape = {k: v for k, v in record["cuts"].items() if v}
    print(f"activation-based shape: {record['shape_after']} (cuts {same_shape})", flush=True)
    arts["activation + repair"] = make(
        args.work,
        "activation-repair",
        {"stages": [{"prune": prune}, {"distill": distill}], "calib": calib},
    )
    random = {**same_shape, "importance": "random"}
    arts["random"] = make(args.work, "random", {"stages": [{"prune": random}], "calib": calib})
    arts["random + repair"] = make(
        args.work,
        "random-repair",
        {"stages": [{"prune": random}, {"distill": distill}], "calib": calib},
    )
    depth = {"params": args.params, "split": ["layers"]}
    arts["depth only"] = make(args.work, "depth", {"stages": [{"prune": depth}], "calib": calib})
    if args.repair_depth:
        arts["depth only + repair"] = make(
            args.work,
            "depth-repair",
            {"stages": [{"prune": depth}, {"distill": distill}], "calib": calib},
        )

    ckpt = resolve("default")
    tok = load_tokenizer(ckpt)
    base = load_model(ckpt)
    windows = eval_windows(
        token_stream(tok, read_texts(str(args.data / "test.txt"))), args.ctx, args.windows
    )
    models = {
        name: RuntimeLM(load_weights(resolve(str(p))), max_len=args.ctx) for name, p in arts.items()
    }
    drift = measure_drift(base, models, windows, data="wikitext-2 test")
    extra = {}
    for name, path in arts.items():
        m = read_manifest(path)
        prune_rec = m["stages"][0]
        counts = prune_rec["non_embedding_params"]
        row = {
            "kept non-emb params": f"{counts['after'] / counts['before']:.1%}",
            "shape (hidden/heads/mlp/layers)": "/".join(
                str(prune_rec["shape_after"][k])
                for k in ("hidden", "heads", "intermediate", "layers")
            ),
        }
        if len(m["stages"]) > 1:
            d = m["stages"][1]
            row["repair"] = (
                f"{d['tokens']:,} tok, {d['seconds_this_run'] / 60:.1f} min, "
                f"{d['tokens_per_second']:.0f} tok/s, peak RSS {d['peak_rss_mb']} MB"
            )
        extra[name] = row
    table = format_table(drift, extra)
    gap = drift["activation"].kl
    closed = (gap - drift["activation + repair"].kl) / gap
    rgap = drift["random"].kl
    rclosed = (rgap - drift["random + repair"].kl) / rgap
    print(table)
    print(f"repair closed {closed:.1%} of the activation-pruned KL gap ({rclosed:.1%} for random)")

    # decode speed, batch 1, original vs pruned+repaired, fp32 and w4
    for name, src in (("original", "default"), ("pruned", str(arts["activation + repair"]))):
        out = args.work / f"w4-{name}"
        llmpress(
            "compress",
            src,
            "-o",
            str(out),
            "--quant",
            "rtn:w4g64",
            "--lm-head",
            "w8",
            "--overwrite",
        )
        arts[f"w4 {name}"] = out
    bandwidth, flops = measure_bandwidth(), measure_matmul_flops()
    speed = {}
    for name, src in (
        ("fp32 original", "default"),
        ("fp32 pruned + repaired", str(arts["activation + repair"])),
        ("w4 original", str(arts["w4 original"])),
        ("w4 pruned + repaired", str(arts["w4 pruned"])),
    ):
        weights = load_weights(resolve(src))
        r = bench_one(weights, 1, 32, 128, bandwidth, flops)
        speed[name] = {
            "tokens_per_s": round(r.tokens_per_s, 1),
            "tpot_ms": round(r.tpot_s * 1e3, 2),
            "ttft_ms": round(r.ttft_s * 1e3, 1),
            "weight_mb": round(weights.step_bytes / 1e6, 1),
        }
        print(name, speed[name], flush=True)

    result = {
        "machine": {"platform": platform.platform(), "python": sys.version.split()[0]},
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "args": {k: _portable(v) for k, v in vars(args).items()},
        "drift": {k: v.to_dict() for k, v in drift.items()},
        "rows": extra,
        "kl_gap_closed": {"activation": closed, "random": rclosed},
        "shape": record["shape_after"],
        "splits_tried": record.get("splits_tried"),
        "decode_batch1": speed,
        "bandwidth_gb_s": round(bandwidth / 1e9, 1),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "pruning.json").write_text(json.dumps(result, indent=2))
    (args.out / "pruning.md").write_text(
        table
        + f"\n\nrepair closed {closed:.1%} of the KL gap (random: {rclosed:.1%})\n\n"
        + "\n".join(f"- {k}: {v}" for k, v in speed.items())
        + "\n"
    )


if __name__ == "__main__":
    main()
