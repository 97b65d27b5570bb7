"""The quantized-model repair's settings on one pre-repair state (issue 16).

A chain row of benchmarks/quality.py costs half an hour, most of it before the repair.
This runs the chain's block stages once (mixed precision, AWQ, GPTQ, tune, as
quality.py builds them), then, in place of the pipeline's repair, trains each setting of
`distill` on its own copy of the same quantized state and evaluates the student as the
artifact would store it (scales and dense tensors rounded to the storage dtype) with the
protocol of ../shared/guide/MEASURING.md. No artifact is written. With the default
settings the first variant equals quality.py's chain row exactly.

    python benchmarks/repair_sweep.py [--bits 4.6] [--dtype bfloat16] [--scheme w4g64]
        [--rows mixed+gptq+distill] [--samples 128] [--gptq-target original]
        [--variants scale_lr=0.001 scale_lr=0.003 tokens=65536 precision=bf16 ...]

A variant's `samples=N` has the repair cut N samples of its own from the calibration
text (`data=` another source). Each variant's row is written as soon as it is measured.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import json
import tempfile
import time
from pathlib import Path

import torch
from batched_decode import cpu_flags
from quality import REPAIR, ROWS, SCHEMES, recipe_for
from wikitext import DATA, require

import compress.pipeline as pipeline
from compress.artifact.dense import load_model
from compress.calib_data import eval_windows, read_texts, token_stream
from compress.calib_data.prepare import load_calibration
from compress.distill.quantized import QuantLinear
from compress.distill.stage import Distill
from compress.eval.drift import measure_drift
from compress.model.loading import load_tokenizer, resolve
from compress.stage import ModelContext

HERE = Path(__file__).resolve().parent
DEFAULT_VARIANTS = ["scale_lr=0.0005", "scale_lr=0.001", "scale_lr=0.003", "tokens=65536"]


class _Swept(Exception):
    """Raised once every variant ran: the pipeline stops before writing an artifact."""


def parse_variant(text: str) -> dict:
    """`scale_lr=0.003,tokens=65536` → DistillConfig overrides."""
    out = {}
    for part in filter(None, text.split(",")):
        key, value = part.split("=", 1)
        if key in ("tokens", "batch", "samples"):
            out[key] = int(value)
        elif key in ("precision", "parallel", "data"):
            out[key] = value
        elif key == "train_dense":
            out[key] = value.lower() in ("1", "true", "yes")
        else:
            out[key] = float(value)
    return out


@torch.no_grad()
def as_stored(model: torch.nn.Module, dtype: torch.dtype) -> float:
    """Round what the artifact stores in floating point (scales, dense tensors) to `dtype`
    and fold trained code offsets into the codes; returns the share of codes they moved."""
    moved = total = 0
    for module in model.modules():
        if isinstance(module, QuantLinear):
            module.scale0.copy_(module.scale().to(dtype).float())
            module.log_scale.zero_()
            codes = module.codes().to(torch.int8)
            moved, total = moved + int((codes != module.q).sum()), total + codes.numel()
            module.q.copy_(codes)
            if module.code_offset is not None:
                module.code_offset.zero_()
    for name, p in model.named_parameters():
        if not name.endswith("log_scale"):
            p.copy_(p.to(dtype).float())
    return moved / max(total, 1)


def sweep(variants: list[str], base, windows, rows: list, work: Path, source: str, save):
    """A stand-in for pipeline.repair_quantized: every variant on a copy of the state;
    `source` is the calibration text a variant's own `samples` are cut from, and `save`
    writes the rows measured so far."""

    def run(run, samples):
        ws = run.ws
        for text in variants:
            started = time.perf_counter()
            overrides = parse_variant(text)
            if "samples" in overrides:
                overrides.setdefault("data", source)
            teacher = load_model(run.source)
            student = load_model(ws.store.ckpt)
            with torch.no_grad():
                for name, tensor in ws.updated.items():
                    student.get_parameter(name).copy_(tensor.float())
            ctx = ModelContext(
                teacher=teacher,
                model=student,
                config=dict(ws.config),
                adapter=ws.adapter,
                tokenizer=ws.tokenizer,
                samples=samples,
                work_dir=work,
                resume=False,
                load_text=lambda cfg, teacher=teacher: load_calibration(
                    cfg, ws.tokenizer, lambda: teacher
                ),
                log=run.log,
                quantized=copy.deepcopy(ws.quantized),
                updated={},  # what a train_dense repair would store: the student holds it
                storage_dtype=ws.storage_dtype,
            )
            config = dataclasses.replace(run.after[0].config, **overrides)
            record = Distill(config).run(ctx)
            seconds = time.perf_counter() - started
            moved = as_stored(student, ws.storage_dtype)
            drift = measure_drift(base, {text: student}, windows, data="test.txt")[text]
            rows.append({
                "variant": text,
                **drift.to_dict(),
                "repair_s": round(seconds),
                "steps": record["steps"],
                "precision": record["precision"],
                "train_kl": record["loss_history"][-1][1],
                "codes_moved": moved,
            })  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
            save()
        raise _Swept

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bits", type=float, default=4.6, help="mixed precision budget (0: uniform)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--scheme", default="w4g64", choices=list(SCHEMES))
    ap.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS)
    ap.add_argument(
        "--rows",
        default=None,
        choices=[r for r in ROWS if r.endswith("+distill")],
        help="the chain (default: mixed+awq+gptq+tune+distill, or without mixed at --bits 0)",
    )
    ap.add_argument("--samples", type=int, default=128, help="calibration samples")
    ap.add_argument("--windows", type=int, default=64)
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--name", default="repair_sweep", help="results file stem")
    ap.add_argument(
        "--gptq-target",
        choices=["reference", "original"],
        help="what GPTQ's rounding fits (default: its own); the label names a setting given",
    )
    args = ap.parse_args()
    require(args.data)
    ckpt = resolve("default")
    base = load_model(ckpt)
    stream = token_stream(load_tokenizer(ckpt), read_texts(str(args.data / "test.txt")))
    windows = eval_windows(stream, 512, args.windows)
    calib = {"source": str(args.data / "valid.txt"), "samples": args.samples, "length": 512}
    row = args.rows or ("mixed+awq+gptq+tune+distill" if args.bits else "awq+gptq+tune+distill")
    gptq = {"target": args.gptq_target} if args.gptq_target else None
    recipe = recipe_for(row, SCHEMES[args.scheme], calib, args.bits, args.dtype, gptq=gptq)
    rows: list[dict] = []
    chain = row.removesuffix("+distill")
    if args.bits and chain.startswith("mixed"):
        chain = chain.replace("mixed", f"mixed@{args.bits}", 1)
    label = f"{chain} {args.scheme}" + (f" target={args.gptq_target}" if gptq else "")
    meta = {
        "chain": label,
        "dtype": args.dtype,
        "samples": args.samples,
        "windows": args.windows,
        "repair": REPAIR,
        "cpu": cpu_flags(),
    }
    out = HERE / "results" / args.name

    def save() -> str:
        lines = [
            f"{label} {args.dtype}, then the repair (defaults: {REPAIR}, scale_lr 1e-3):",
            "",
            "| repair setting | steps | precision | ppl | KL | top-1 | last step's KL | repair s |",
            "|---|---|---|---|---|---|---|---|",
            *(
                f"| {r['variant']} | {r['steps']} | {r['precision']} | {r['ppl']:.3f} | "
                f"{r['kl']:.5f} | {r['top1']:.4f} | {r['train_kl']} | {r['repair_s']} |"
                for r in rows
            ),
        ]
        out.with_suffix(".json").write_text(json.dumps({**meta, "rows": rows}, indent=2) + "\n")
        out.with_suffix(".md").write_text("\n".join(lines) + "\n")
        return "\n".join(lines)

    with tempfile.TemporaryDirectory() as tmp:
        swept = sweep(args.variants, base, windows, rows, Path(tmp), calib["source"], save)
        pipeline.repair_quantized = swept
        with contextlib.suppress(_Swept):  # raised once the sweep is done
            pipeline.compress("default", recipe, Path(tmp) / "artifact", log=print)
    print(save())


if __name__ == "__main__":
    main()
