"""Quality beyond AWQ (issue 16): every rounding method and their chain, in one run.

Protocol (../shared/guide/MEASURING.md): calibrate on WikiText-2 raw valid.txt
(128 samples × 512 tokens), evaluate on test.txt read whole, the first 64 windows of 512
tokens, against the fp32 original; every row compared with the same original logits.
Each row is one recipe compressed with `llmpress`'s own pipeline; its bits per weight
count scales and zero points (the manifest's figure), its minutes are the wall time of
the compression on this machine (loading and writing included). A row with mixed
precision also records its plan in the JSON: how many linears took each scheme.

    python benchmarks/quality.py [--rows awq gptq ...] [--schemes w4g64 w3g64] [--bits 4.5]
                                 [--runs ROW:SCHEME[@KEY=VALUE,...] ...]
                                 [--mixed-options SCHEME ...]
                                 [--dtype bfloat16] [--tune-steps 50] [--repair-steps 128]
                                 [--samples 128] [--preset-samples N]
                                 [--windows 64] [--append]

`--append` adds rows to the results file of an earlier run (same protocol); quality
figures do not depend on the machine's load, but minutes compare only within one run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import tempfile
import time
from pathlib import Path

from wikitext import DATA, require

from compress.artifact.dense import load_model
from compress.calib_data import eval_windows, read_texts, token_stream
from compress.eval.drift import Drift, format_table, measure_drift
from compress.model.loading import load_tokenizer, resolve
from compress.pipeline import compress
from compress.recipe import parse_recipe, recipe_from_flags

HERE = Path(__file__).resolve().parent

# Each row: the stages after the scheme is filled in (the scheme keys go to every
# quantizing stage). Rows build on each other in the order the issue lists them.
ROWS = {
    "rtn": ["rtn"],
    "awq": ["awq"],
    "gptq": ["gptq"],
    "awq+gptq": ["awq", "gptq"],
    "awq+gptq+tune": ["awq", "gptq", "tune"],
    "awq+gptq+tune+distill": ["awq", "gptq", "tune", "distill"],
    "mixed+awq+gptq+tune": ["mixed", "awq", "gptq", "tune"],  # to --bits per weight
    "mixed+awq+gptq+tune+distill": ["mixed", "awq", "gptq", "tune", "distill"],
    "gptq+distill": ["gptq", "distill"],
    "mixed+gptq": ["mixed", "gptq"],
    "mixed+gptq+distill": ["mixed", "gptq", "distill"],
    "mixed+gptq+tune+distill": ["mixed", "gptq", "tune", "distill"],
    # the presets exactly as `--quant NAME:<scheme>` runs them (their own budget, dtype and
    # number of calibration samples unless --preset-samples is given)
    "fast": [],
    "best": [],
}
PRESET_ROWS = ("fast", "best")
SCHEMES = {
    "w4g64": {"bits": 4, "group_size": 64, "zero_point": False},
    "w3g64": {"bits": 3, "group_size": 64, "zero_point": False},
    "w2g64": {"bits": 2, "group_size": 64, "zero_point": False},
    # zero points: better quality, but only transformers' dequantize=True path and vLLM
    # load them (docs/format.md), so they are a comparison, not the default
    "w4g64zp": {"bits": 4, "group_size": 64, "zero_point": True},
    "w3g64zp": {"bits": 3, "group_size": 64, "zero_point": True},
    "w2g64zp": {"bits": 2, "group_size": 64, "zero_point": True},
    # the same bits spent otherwise: coarser groups leave more of a preset's budget to
    # mixed precision's 8-bit linears (best:w4g128zp: KL 0.0666, best:w4g64zp 0.0664)
    "w4g128zp": {"bits": 4, "group_size": 128, "zero_point": True},
    # and finer: with 16-bit scales w3g32zp is 3.59 bits and w2g32zp 2.56, nearly a
    # preset's whole budget (B + 0.6) in one scheme (best: KL 0.244 and 0.844, against
    # 0.208 and 0.786 at groups of 64 with 4-bit linears; finer_groups.json)
    "w3g32zp": {"bits": 3, "group_size": 32, "zero_point": True},
    "w2g32zp": {"bits": 2, "group_size": 32, "zero_point": True},
}


# the repair's budget: 32 steps of 2 × 512 tokens (about 20 s a step on 2 cores)
REPAIR = {"tokens": 32768, "batch": 2}


def recipe_for(
    row: str,
    scheme: dict,
    calib: dict,
    bits: float,
    dtype: str = "auto",
    tune: dict | None = None,
    repair: dict | None = None,
    label: str = "",
    preset_n: int | None = None,
    options: list[str] | None = None,
    gptq: dict | None = None,
):
    if row in PRESET_ROWS:  # the preset as the CLI builds it; --dtype and gptq settings
        flags = {"dtype": None if dtype == "auto" else dtype}  # still override
        recipe = recipe_from_flags(None, f"{row}:{label}", calib | {"samples": preset_n}, flags)
        if not gptq:
            return recipe
        data = recipe.to_dict()
        data["stages"] = [
            {n: {**s, **gptq} if n == "gptq" else s for n, s in st.items()} for st in data["stages"]
        ]
        return parse_recipe(data)
    mixed = {"bits_budget": bits} | ({"options": options} if options else {})
    settings = {"tune": tune or {}, "distill": repair or REPAIR, "mixed": mixed}
    settings["gptq"] = scheme | (gptq or {})
    stages = [{name: settings.get(name, scheme)} for name in ROWS[row]]
    return parse_recipe({"stages": stages, "calib": calib, "dtype": dtype})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    ap.add_argument("--schemes", nargs="+", default=["w4g64"], choices=list(SCHEMES))
    ap.add_argument(
        "--runs",
        nargs="+",
        metavar="ROW:SCHEME[@KEY=VALUE,...]",
        help="exactly these rows, each with its scheme (best:w4g64 ...), in place of every "
        "--rows with every --schemes: the presets' table in one run. After `@`, the run's "
        f"own settings, overriding the flags: {', '.join(RUN_SETTINGS)} "
        "(mixed_options joined by /), e.g. mixed+gptq+distill:w3g64zp@bits=3.6,samples=256",
    )
    ap.add_argument("--bits", type=float, default=4.5, help="mixed precision's budget")
    ap.add_argument(
        "--mixed-options",
        nargs="+",
        metavar="SCHEME",
        help="the schemes mixed precision may give a linear besides the row's (default: its "
        "own); the label lists them",
    )
    ap.add_argument(
        "--dtype",
        default="auto",
        help="storage dtype of scales and dense tensors (auto: the checkpoint's, fp32 here; "
        "bfloat16 is what a bf16 checkpoint gets: 16-bit scales make w4g64 4.25 bits)",
    )
    ap.add_argument("--tune-steps", type=int, help="tune's steps per block (default: its own)")
    ap.add_argument(
        "--repair-steps", type=int, help="the repair's steps of 2 × 512 tokens (default: 32)"
    )
    ap.add_argument(
        "--repair-samples",
        type=int,
        help="samples the repair cuts from the calibration text (default: the calibration "
        "samples): more distinct text per step than GPTQ needs; the label names it",
    )
    ap.add_argument(
        "--repair-scale-lr",
        type=float,
        help="the repair's Adam lr of the log-scales and zero points (default: its own, "
        "1e-3); the label names it",
    )
    ap.add_argument(
        "--gptq-target",
        choices=["reference", "original"],
        help="what GPTQ's rounding fits (default: its own, reference); a row with "
        "`original` says so in its label",
    )
    ap.add_argument("--windows", type=int, default=64)
    ap.add_argument("--samples", type=int, default=128)
    ap.add_argument(
        "--preset-samples",
        type=int,
        help="calibration samples of the preset rows (default: theirs)",
    )
    ap.add_argument("--length", type=int, default=512)
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument(
        "--calib",
        default="valid.txt",
        help="calibration text: valid.txt of --data (the protocol), or `self` (what a user "
        "without data gets: text the model writes); a `self` row's label says so",
    )
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--name", default="quality", help="results file stem")
    ap.add_argument(
        "--append", action="store_true", help="keep the rows already in the results file"
    )
    args = ap.parse_args()
    require(args.data)

    base_ckpt = resolve("default")
    tokenizer = load_tokenizer(base_ckpt)
    base = load_model(base_ckpt)
    stream = token_stream(tokenizer, read_texts(str(args.data / "test.txt")))
    windows = eval_windows(stream, 512, args.windows)
    source = "self" if args.calib == "self" else str(args.data / args.calib)
    calib = {"source": source, "samples": args.samples, "length": args.length}
    results, extra, timing = {}, {}, {}
    args.out.mkdir(parents=True, exist_ok=True)
    previous = args.out / f"{args.name}.json"
    if args.append and previous.is_file():  # rows of an earlier run of the same protocol
        results, extra, timing = _read(previous, calib, args.windows)
    for row, scheme, run in _runs(ap, args):
        args = run  # the run's own settings: the command line's with its overrides
        label = f"{row.replace('mixed', f'mixed@{args.bits}')} {scheme}"
        if row in PRESET_ROWS:
            label = f"{row}:{scheme}"
        if args.samples != calib["samples"]:  # a run's own calibration, not the protocol's
            label += f" samples={args.samples}"
        if args.dtype != "auto":
            label += f" {args.dtype}"
        if args.calib == "self":
            label += " (self-generated calibration)"
        if args.mixed_options and "mixed" in ROWS[row]:
            label += f" options={','.join(args.mixed_options)}"
        gptq = {}
        if args.gptq_target is not None and (row in PRESET_ROWS or "gptq" in ROWS[row]):
            gptq = {"target": args.gptq_target}
            label += f" target={args.gptq_target}"
        tune = {"steps": args.tune_steps} if args.tune_steps else {}
        if tune and "tune" in ROWS[row]:
            label += f" tune{args.tune_steps}"
        repair = None
        if args.repair_steps and "distill" in ROWS[row]:
            repair = REPAIR | {"tokens": args.repair_steps * REPAIR["batch"] * args.length}
            label += f" repair{args.repair_steps}"
        if args.repair_samples and "distill" in ROWS[row]:
            repair = (repair or REPAIR) | {"data": source, "samples": args.repair_samples}
            label += f" repair_samples={args.repair_samples}"
        if args.repair_scale_lr and "distill" in ROWS[row]:
            repair = (repair or REPAIR) | {"scale_lr": args.repair_scale_lr}
            label += f" scale_lr={args.repair_scale_lr:g}"
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "artifact"
            t0 = time.perf_counter()
            recipe = recipe_for(
                row,
                SCHEMES[scheme],
                calib | {"samples": args.samples},
                args.bits,
                args.dtype,
                tune,
                repair,
                scheme,
                preset_n=args.preset_samples
                or (args.samples if args.samples != calib["samples"] else None),
                options=args.mixed_options,
                gptq=gptq,
            )
            compress("default", recipe, out, log=print)
            minutes = (time.perf_counter() - t0) / 60
            manifest = json.loads((out / "manifest.json").read_text())
            model = load_model(resolve(str(out)))
        extra[label] = {
            "bits/weight": manifest["weights"]["bits_per_quantized_weight"],
            "minutes": f"{minutes:.1f}",
        }
        # mixed precision's plan: how many linears took each scheme
        for stage in manifest["stages"]:
            if stage["stage"] == "mixed":
                extra[label]["plan"] = stage["schemes"]
        timing[label] = {
            "pipeline": manifest["timing_s"],
            "estimate": manifest.get("estimate_s", {}),  # what compress said before
            **{r["stage"]: r.get("seconds", {}) for r in manifest["stages"]},
        }
        # each row evaluated as soon as it is made: a long run keeps what it measured
        results.update(measure_drift(base, {label: model}, windows, data="test.txt"))
        del model
        _write(args, calib, results, extra, timing)
        print(label, results[label].to_dict(), extra[label], json.dumps(timing[label]))
    print(f"original: ppl {next(iter(results.values())).base_ppl:.3f}")
    print(format_table(results, _columns(extra)))


# a run's own settings after `@` (`best:w3g64zp@samples=256,repair=512`): the command
# line's flag each stands for, and how its value reads (mixed options joined by `/`)
RUN_SETTINGS = {
    "bits": ("bits", float),
    "samples": ("samples", int),
    "dtype": ("dtype", str),
    "repair": ("repair_steps", int),
    "repair_samples": ("repair_samples", int),
    "scale_lr": ("repair_scale_lr", float),
    "tune": ("tune_steps", int),
    "target": ("gptq_target", str),
    "options": ("mixed_options", lambda v: v.split("/")),
}


def _runs(ap: argparse.ArgumentParser, args) -> list[tuple[str, str, argparse.Namespace]]:
    """(row, scheme, settings): --runs as given, each with the command line's settings and
    its own after `@`; or every --rows row for each --schemes."""
    if not args.runs:
        return [(row, scheme, args) for scheme in args.schemes for row in args.rows]
    runs = []
    for text in args.runs:
        pair, _, settings = text.partition("@")
        row, _, scheme = pair.partition(":")
        if row not in ROWS or scheme not in SCHEMES:
            ap.error(f"--runs {text}: want ROW:SCHEME[@KEY=VALUE,...], ROW one of {list(ROWS)}, "
                     f"SCHEME one of {list(SCHEMES)}")  # fmt: skip
        run = argparse.Namespace(**vars(args))
        for item in filter(None, settings.split(",")):
            key, _, value = item.partition("=")
            if key not in RUN_SETTINGS or not value:
                ap.error(f"--runs {text}: {item!r} is not KEY=VALUE with KEY one of "
                         f"{list(RUN_SETTINGS)}")  # fmt: skip
            name, read = RUN_SETTINGS[key]
            setattr(run, name, read(value))
        runs.append((row, scheme, run))
    return runs


def _read(path: Path, calib: dict, windows: int) -> tuple[dict, dict, dict]:
    record = json.loads(path.read_text())
    if record["windows"] != windows or record["calibration"]["samples"] != calib["samples"]:
        raise SystemExit(f"{path}: another protocol (windows, samples); not appending")
    fields = {f.name for f in dataclasses.fields(Drift)}
    results, extra = {}, {}
    for label, row in record["results"].items():
        results[label] = Drift(**{k: v for k, v in row.items() if k in fields})
        extra[label] = {k: row[k] for k in ("bits/weight", "minutes", "plan") if k in row}
    return results, extra, record["timing_s"]


def _write(args, calib: dict, results: dict, extra: dict, timing: dict) -> None:
    record = {
        "benchmark": "quality",
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "calibration": calib | {"source": "valid.txt"},
        "windows": args.windows,
        "results": {k: {**v.to_dict(), **extra[k]} for k, v in results.items()},
        "timing_s": timing,
    }
    (args.out / f"{args.name}.json").write_text(json.dumps(record, indent=2) + "\n")
    (args.out / f"{args.name}.md").write_text(format_table(results, _columns(extra)) + "\n")


def _columns(extra: dict) -> dict:
    """The table's extra columns: the plan stays in the JSON, a count per scheme."""
    return {k: {c: v for c, v in e.items() if c != "plan"} for k, e in extra.items()}


if __name__ == "__main__":
    main()
