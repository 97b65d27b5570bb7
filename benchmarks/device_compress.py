"""Compression on a GPU against the CPU: time per block, device memory, and whether the two
make the same artifact.

A checkpoint of a real model's shape with random bf16 weights (random_checkpoint.py) is
compressed with each method:
- on `cuda`, at full depth: time per block and in total, the device's peak memory (the
  manifest's `device_peak_gib`), the process's peak RSS;
- on `cuda` and on `cpu`, a copy of its first `--blocks` blocks (the same tensors): time
  per block on each, and the two artifacts compared tensor by tensor (share of equal
  integers, largest relative difference of the scales).
Then `llmpress bench --batch 1` decodes the full-depth rtn artifact (Triton on CUDA).

    python benchmarks/device_compress.py --shape llama-3.2-1b --methods rtn,awq,gptq \\
        --blocks 2 --samples 16 --length 512 --calib CALIB.txt --tokenizer DIR --out OUT

`--tokenizer` defaults to the default model's (converted from its GGUF); `--calib` to
WikiText-2's valid.txt beside the project. Random weights say nothing about quality: the
point is where the time goes and that the device computes what the CPU does.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from random_checkpoint import SHAPES, parameters, write  # noqa: E402
from scale import LLMPRESS, measure  # noqa: E402

DATA = HERE.parent.parent / "shared" / "data" / "wikitext-2-raw"


def compress(src: Path, out: Path, method: str, device: str, args, logs: Path) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    cmd = [*LLMPRESS, "compress", str(src), "-o", str(out), "--quant", f"{method}:w4g64",
           "--device", device]  # fmt: skip
    if method != "rtn":
        cmd += ["--calib", str(args.calib), "--calib-samples", str(args.samples),
                "--calib-len", str(args.length)]  # fmt: skip
    try:
        row = measure(cmd, logs / f"{out.name}.log")
    except SystemExit as failed:  # one failing run is a finding, not the end of the others
        print(failed, flush=True)
        return {"failed": str(failed)[-1500:]}
    manifest = json.loads((out / "manifest.json").read_text())
    timing = manifest.get("timing_s", {})
    layers = json.loads((src / "config.json").read_text())["num_hidden_layers"]
    walk = sum(v for k, v in timing.items() if k not in ("calibration data", "lm_head"))
    row.update(
        device=manifest.get("device"),
        device_peak_gib=manifest.get("device_peak_gib"),
        s_per_block=round(walk / layers, 2),
        timing_s=timing,
    )
    return row


def compare(a: Path, b: Path) -> dict:
    """Share of equal integers over every integer tensor, largest relative difference of
    every float tensor (scales, norms), between two artifacts with the same tensors."""
    from safetensors.torch import load_file

    left, right = {}, {}
    for f in sorted(a.glob("*.safetensors")):
        left.update(load_file(f))
    for f in sorted(b.glob("*.safetensors")):
        right.update(load_file(f))
    if set(left) != set(right):
        return {"same_tensors": False}
    equal = total = 0
    worst = 0.0
    for name, x in left.items():
        y = right[name]
        if x.dtype.is_floating_point:
            x, y = x.float(), y.float()
            diff = (x - y).abs().max().item() / max(x.abs().max().item(), 1e-30)
            worst = max(worst, diff)
        elif name.endswith("weight_packed"):  # eight 4-bit codes per int32
            shifts = range(0, 32, 4)
            xs = [(x >> s) & 15 for s in shifts]
            ys = [(y >> s) & 15 for s in shifts]
            equal += sum(int((p == q).sum()) for p, q in zip(xs, ys, strict=True))
            total += 8 * x.numel()
        else:
            equal += int((x == y).sum())
            total += x.numel()
    return {"same_tensors": True, "codes_equal": round(equal / max(total, 1), 6),
            "float_max_rel_diff": float(f"{worst:.3g}")}  # fmt: skip


def _portable(argv: list[str]) -> str:
    """The command as anyone reruns it: where files go (--work, --out) is this machine's."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--work", "--out"):
            skip = True
        else:
            kept.append(arg)
    return " ".join(kept)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="llama-3.2-1b", choices=list(SHAPES))
    ap.add_argument("--methods", default="rtn,awq,gptq")
    ap.add_argument("--devices", default="cuda,cpu", help="the first runs at full depth")
    ap.add_argument("--blocks", type=int, default=2, help="depth of the copy both devices run")
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--length", type=int, default=512)
    ap.add_argument("--calib", type=Path, default=DATA / "valid.txt")
    ap.add_argument("--tokenizer", type=Path)
    ap.add_argument("--skip", default="", help="steps to leave out: full,bench")
    ap.add_argument("--work", type=Path, default=HERE / "work" / "device")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "device_compress.json")
    args = ap.parse_args()
    if args.tokenizer is None:
        from compress.model.default import convert_gguf, default_gguf

        args.tokenizer = convert_gguf(default_gguf())
    skip = set(filter(None, args.skip.split(",")))
    shape, devices = SHAPES[args.shape], args.devices.split(",")
    work = args.work / args.shape
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    full, short = work / "checkpoint", work / f"checkpoint-{args.blocks}-blocks"
    compared = len(devices) > 1
    for folder, s in ((full, shape), (short, replace(shape, layers=args.blocks))):
        if (folder == full and "full" in skip) or (folder == short and not compared):
            continue
        if not folder.exists():
            t = time.perf_counter()
            write(s, folder, args.tokenizer)
            print(f"wrote {folder.name} in {time.perf_counter() - t:.0f} s", flush=True)
    record = {
        "command": "python benchmarks/device_compress.py " + _portable(sys.argv[1:]),
        "shape": args.shape,
        "parameters_b": round(parameters(shape) / 1e9, 2),
        "layers": shape.layers,
        "calibration": {"samples": args.samples, "length": args.length},
        "threads": os.cpu_count(),
        "rows": [],
    }
    for method in args.methods.split(","):
        row = {"method": f"{method}:w4g64"}
        if "full" not in skip:
            row["full_depth"] = compress(
                full, work / f"{method}-{devices[0]}-full", method, devices[0], args, logs
            )
            print(method, "full depth", row["full_depth"], flush=True)
        outs = {}
        for device in devices if compared else []:
            outs[device] = work / f"{method}-{device}-{args.blocks}"
            row[f"{args.blocks}_blocks_{device}"] = compress(
                short, outs[device], method, device, args, logs
            )
            print(method, device, row[f"{args.blocks}_blocks_{device}"], flush=True)
        if compared and all((o / "manifest.json").exists() for o in outs.values()):
            row["compared"] = compare(outs[devices[0]], outs[devices[1]])
            print(method, "compared", row["compared"], flush=True)
        record["rows"].append(row)
    artifact = work / f"rtn-{devices[0]}-full"
    if "bench" not in skip and (artifact / "manifest.json").exists():
        out = logs / "bench.json"
        cmd = [*LLMPRESS, "bench", str(artifact), "--batch", "1", "--prompt-len", "32",
               "--output-len", "64", "--json", str(out)]  # fmt: skip
        row = measure(cmd, logs / "bench.log")
        if out.exists():
            result = json.loads(out.read_text())["results"][0]
            row.update(tok_s=round(result["tokens_per_s"], 1), mbu=round(result["mbu"], 3))
        record["bench"] = row
        print("bench", row, flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
