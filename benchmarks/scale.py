"""Compression, eval and decode at the sizes users bring: peak memory and time.

Checkpoints of real models' shapes with random bf16 weights (random_checkpoint.py:
SmolLM2-135M, Qwen2.5-0.5B, Llama-3.2-1B, Qwen2.5-7B, Llama-3-8B) are written tensor by
tensor, then each command runs in its own process:
- `llmpress compress --quant rtn|awq|gptq:w4g64` with few calibration samples;
- `llmpress eval` of the rtn artifact against its original (twice: the second reads the
  original's cached figures);
- `llmpress bench --batch 1` of the rtn artifact.
Reported: each process's peak RSS (the kernel's ru_maxrss), wall time, compress time per
block (the manifest's block-walk timing over the block count), the phase that was running
when the resident memory peaked (sampled from /proc every 0.1 s against the log), and
decode tok/s with MBU.

    python benchmarks/scale.py [--shapes smollm2-135m,llama-3.2-1b,qwen2.5-7b,llama-3-8b]
        [--methods rtn,awq,gptq] [--work DIR] [--keep]

Checkpoints go under --work (default benchmarks/work/scale; 7B and 8B take 15-16 GB each)
and are deleted after their row unless --keep.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DATA = ROOT.parent / "shared" / "data" / "wikitext-2-raw"
sys.path.insert(0, str(HERE))

from batched_decode import cpu_flags  # noqa: E402
from random_checkpoint import SHAPES, parameters, write  # noqa: E402

LLMPRESS = [sys.executable, "-m", "compress"]


def _rss_kb(pid: int, field: str = "VmRSS") -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def measure(cmd: list[str], log: Path, env: dict | None = None, cwd: Path | None = None) -> dict:
    """Run `cmd` (in `cwd`: `python -m` imports from there first); its peak RSS (GB), wall
    time (s), and the log line last printed before
    the sampled peak (what was running). The peak is the child's own high-water mark
    (VmHWM, sampled every 0.1 s), not wait4's ru_maxrss: Linux starts a forked child's
    ru_maxrss at the parent's resident size, so a parent holding gigabytes (one that has
    just written a checkpoint or compared two artifacts) inflated every figure after it."""
    t0 = time.perf_counter()
    with open(log, "w") as err:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=err, text=True, env=env, cwd=cwd
        )
        peak = {"kb": 0, "at": 0, "hwm": 0}
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                kb = _rss_kb(proc.pid)
                if kb > peak["kb"]:
                    peak["kb"], peak["at"] = kb, log.stat().st_size
                peak["hwm"] = max(peak["hwm"], _rss_kb(proc.pid, "VmHWM"))
                stop.wait(0.1)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)
        stop.set()
        sampler.join()
    text = log.read_text()
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"{' '.join(cmd)} failed:\n{text[-3000:]}")
    before = text[: peak["at"]].strip().splitlines()
    return {
        "peak_rss_gb": round((peak["hwm"] or usage.ru_maxrss) / 2**20, 2),
        "wall_s": round(time.perf_counter() - t0, 1),
        "peak_during": before[-1][-120:] if before else "start",
        "cpu": cpu_flags(),  # a row keeps steps of earlier runs, maybe on another machine
    }


def compress(
    src: Path, out: Path, method: str, samples: int, length: int, logs: Path, *extra: str
) -> dict:
    cmd = [*LLMPRESS, "compress", str(src), "-o", str(out), "--quant", f"{method}:w4g64", *extra]
    if method != "rtn":
        cmd += ["--calib", str(DATA / "valid.txt"), "--calib-samples", str(samples),
                "--calib-len", str(length)]  # fmt: skip
    row = measure(cmd, logs / f"compress-{method}{''.join(extra)}.log")
    manifest = json.loads((out / "manifest.json").read_text())
    timing = manifest.get("timing_s", {})
    layers = json.loads((src / "config.json").read_text())["num_hidden_layers"]
    walk = sum(v for k, v in timing.items() if k not in ("calibration data", "lm_head"))
    row.update(timing_s=timing, s_per_block=round(walk / layers, 2))
    row["artifact_gb"] = round(sum(f.stat().st_size for f in out.iterdir()) / 1e9, 2)
    return row


def fresh_eval_cache(work: Path) -> Path:
    """A cache folder holding everything the user's has (built kernels, converted
    checkpoints) but the original's eval figures: the first eval must compute them."""
    from compress.model.default import cache_dir

    fresh = work / "cache"
    shutil.rmtree(fresh, ignore_errors=True)
    fresh.mkdir(parents=True)
    for entry in cache_dir().iterdir():
        if entry.name != "eval":
            (fresh / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    return fresh


def evaluate(src: Path, artifact: Path, logs: Path, tag: str, cache: Path, *extra: str) -> dict:
    cmd = [*LLMPRESS, "eval", str(artifact), "--base", str(src), "--data",
           str(DATA / "test.txt"), "--windows", "2", "--ctx", "256", "--json",
           str(logs / f"eval-{tag}.json"), *extra]  # fmt: skip
    row = measure(cmd, logs / f"eval-{tag}.log", env={**os.environ, "LLMPRESS_CACHE": str(cache)})
    drift = json.loads((logs / f"eval-{tag}.json").read_text())
    row["kl"] = drift.get("drift", drift).get("kl")
    row["reference"] = drift.get("drift", drift).get("reference")
    if row["reference"] != ("computed" if tag == "first" else "cached"):
        raise SystemExit(f"eval {tag}: the original's figures were {row['reference']}")
    return row


def bench(artifact: Path, logs: Path) -> dict:
    out = logs / f"bench-{artifact.name}.json"
    cmd = [*LLMPRESS, "bench", str(artifact), "--batch", "1", "--prompt-len", "32",
           "--output-len", "32", "--json", str(out)]  # fmt: skip
    row = measure(cmd, logs / f"bench-{artifact.name}.log")
    record = json.loads(out.read_text())
    result = record["results"][0]
    cache = record.get("last_level_cache_bytes")  # None where sysfs did not say
    row.update(tok_s=round(result["tokens_per_s"], 1), mbu=round(result["mbu"], 3),
               mb_per_step=round(result["bytes_per_step"] / 1e6, 1),
               last_level_cache_mib=cache // 2**20 if cache else None)  # fmt: skip
    return row


def heads(src: Path, work: Path, logs: Path, auto: Path, choices: list[str], rounds: int):
    """The output projection's options at this vocabulary: rtn:w4g64 artifacts differing
    only in --lm-head, benched in interleaved rounds (medians), with their sizes."""
    artifacts = {"auto": auto}
    stages = json.loads((auto / "manifest.json").read_text()).get("stages", [])
    auto_head = next((r["scheme"] for r in stages if r.get("stage") == "lm_head"), "none")
    for choice in choices:
        if choice == auto_head.removesuffix("sym"):  # what auto chose here: the same artifact
            continue
        out = work / f"rtn-head-{choice}"
        shutil.rmtree(out, ignore_errors=True)
        compress(src, out, "rtn", 0, 0, logs, "--lm-head", choice)
        artifacts[choice] = out
    runs: dict[str, list[dict]] = {k: [] for k in artifacts}
    for _ in range(rounds):
        for choice, path in artifacts.items():
            runs[choice].append(bench(path, logs))
    out = {}
    for choice, path in artifacts.items():
        tok = sorted(r["tok_s"] for r in runs[choice])
        size = sum(f.stat().st_size for f in path.iterdir()) / 1e9
        manifest = json.loads((path / "manifest.json").read_text())
        head = next((r for r in manifest.get("stages", []) if r.get("stage") == "lm_head"), {})
        out[choice] = {"tok_s": tok[len(tok) // 2], "runs": tok, "artifact_gb": round(size, 2),
                       "head": head.get("scheme", "as stored")}  # fmt: skip
        if path != auto:
            shutil.rmtree(path)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="smollm2-135m,llama-3.2-1b,qwen2.5-7b,llama-3-8b")
    ap.add_argument("--methods", default="rtn,awq,gptq")
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--skip", default="", help="steps to leave out: eval,bench")
    ap.add_argument(
        "--calibrated-blocks",
        type=int,
        default=0,
        help="run awq and gptq on a copy of each shape with only this many blocks (0: all). "
        "On 2 cores AWQ's search takes minutes per 7B block; time per block and peak memory "
        "do not grow with depth (rtn runs every shape at full depth, awq the 1B one)",
    )
    ap.add_argument("--heads", default="", help="--lm-head options to bench beside auto: w8,none")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--work", type=Path, default=HERE / "work" / "scale")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()
    from compress.model.default import convert_gguf, default_gguf

    tokenizer = convert_gguf(default_gguf())
    skip = set(filter(None, args.skip.split(",")))
    rows = []
    for name in args.shapes.split(","):
        shape = SHAPES[name]
        work = args.work / name
        src, logs = work / "checkpoint", work / "logs"
        methods = args.methods.split(",")
        whole = any(m == "rtn" or not args.calibrated_blocks for m in methods)
        if whole and not src.exists():  # (the calibrated methods' blocks alone need none)
            t = time.perf_counter()
            write(shape, src, tokenizer)
            print(f"{name}: wrote the checkpoint in {time.perf_counter() - t:.0f} s", flush=True)
        logs.mkdir(parents=True, exist_ok=True)
        row = {"shape": name, "parameters_b": round(parameters(shape) / 1e9, 2),
               "layers": shape.layers, "vocab": shape.vocab, "tied": shape.tied,
               "command": "python benchmarks/scale.py " + " ".join(sys.argv[1:])}  # fmt: skip
        for method in methods:
            out = work / f"{method}-w4g64"
            shutil.rmtree(out, ignore_errors=True)
            where = src
            if method != "rtn" and args.calibrated_blocks:
                where = work / f"checkpoint-{args.calibrated_blocks}-blocks"
                if not where.exists():
                    write(replace(shape, layers=args.calibrated_blocks), where, tokenizer)
                row["calibrated_blocks"] = args.calibrated_blocks
            done = compress(where, out, method, args.samples, args.length, logs)
            row[f"compress_{method}"] = done
            print(name, method, row[f"compress_{method}"], flush=True)
            if method != "rtn":
                shutil.rmtree(out)
        artifact = work / "rtn-w4g64"
        if "eval" not in skip and artifact.exists():
            cache = fresh_eval_cache(work)
            row["eval_first"] = evaluate(src, artifact, logs, "first", cache)
            row["eval_cached"] = evaluate(src, artifact, logs, "cached", cache)
            shutil.rmtree(cache)
            print(name, "eval", row["eval_first"], row["eval_cached"], flush=True)
        if "bench" not in skip and artifact.exists():
            row["bench"] = bench(artifact, logs)
            print(name, "bench", row["bench"], flush=True)
        if args.heads and artifact.exists():
            row["heads"] = heads(src, work, logs, artifact, args.heads.split(","), args.rounds)
            print(name, "heads", row["heads"], flush=True)
        rows.append(row)
        if not args.keep:
            shutil.rmtree(work)
    record = {
        "command": "python benchmarks/scale.py " + " ".join(sys.argv[1:]),
        "cpu": cpu_flags(),
        "threads": os.cpu_count(),
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "scale.json"
    if path.exists():  # what was not run this time stays: other shapes, other steps
        old = {r["shape"]: r for r in json.loads(path.read_text())["rows"]}
        merged = []
        for r in rows:
            before = old.pop(r["shape"], {})
            commands = [c for c in before.get("command", "").split(" ; ") if c]
            r = {**before, **r, "command": " ; ".join(dict.fromkeys([*commands, r["command"]]))}
            merged.append(r)
        order = list(SHAPES)
        record["rows"] = sorted([*old.values(), *merged], key=lambda r: order.index(r["shape"]))
    path.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
