"""What glibc's trim threshold costs a compress run: page faults and system time.

`llmpress compress` fixes glibc's mmap threshold at 4 MB so that memory stays one block
(compress/allocator.py). That also pins the trim threshold at glibc's 128 kB default,
and the heap's top is handed back and faulted in again by every next tensor. This runs
the same compress with the trim threshold at 128 kB (the previous behaviour) and at the
allocator's TRIM (64 MB), taking turns, each in its own process, and reports per run the
wall, user and system seconds, minor page faults and peak RSS (the child's rusage), and
the sha256 of the weights written, so that the runs can be seen to write the same bytes.
Each command's runs are kept in the results file under the command (a rerun of another
command adds to it). With `--against REV` the two sides are REV's code and this
checkout's instead, each with the allocator settings it ships (a git worktree of REV).

    python benchmarks/allocator_churn.py [--rounds 2] [--model default] [--quant w4g64]
        [--flags "--calib-samples 8 --calib-len 256"] [--label NAME] [--against REV]
        [--eval ARTIFACT]

With `--eval ARTIFACT` each run is `llmpress eval ARTIFACT --flags` instead, and the
sha256 is of the figures it computed. The runs share the original's cache, which an
untimed eval fills first, so every timed run reads the original from it.

The results' second command, a Llama-3.2-1B-shaped checkpoint of 2 blocks:

    python -c "import sys; sys.path.insert(0, 'benchmarks'); from pathlib import Path;
        from dataclasses import replace; from random_checkpoint import SHAPES, write;
        from compress.model.loading import resolve; write(replace(SHAPES['llama-3.2-1b'],
        layers=2), Path(sys.argv[1]), resolve('default').path)" DIR
    python benchmarks/allocator_churn.py --rounds 1 --model DIR \
        --label llama-3.2-1b-shape-2-blocks --quant gptq:w4g64 --flags \
        "--calib ../shared/data/wikitext-2-raw/valid.txt --calib-samples 8 --calib-len 256"
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from batched_decode import cpu_flags  # noqa: E402
from revision import checkout  # noqa: E402

# the CLI of the package in the first argument, its allocator's trim threshold set to the
# second first (`shipped`: left as the package has it; the mmap threshold always is)
RUN = (
    "import sys; sys.path.insert(0, sys.argv.pop(1)); trim = sys.argv.pop(1)\n"
    "import compress.allocator as a\n"
    "if trim != 'shipped': a.TRIM = int(trim)\n"
    "from compress.cli import main; sys.argv[0] = 'llmpress'; main()"
)
SETTINGS = {"trim 128 kB (before)": 128 << 10, "trim 64 MB (now)": 64 << 20}


# what an eval's result must repeat to the bit, whichever code computed it
FIGURES = ("ppl", "base_ppl", "kl", "top1", "weights_only")


def run_once(
    trim: int | None, model: str, quant: str, flags: list[str], code: Path, evaluate=None
) -> dict:
    """One compress in a process of its own: `code`'s package, its trim threshold set to
    `trim` (None: as shipped). With `evaluate` (an artifact): `eval` of it instead, `flags`
    its flags, and the sha256 is of its figures."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "artifact"
        setting = "shipped" if trim is None else str(trim)
        cmd = [sys.executable, "-c", RUN, str(code), setting]
        if evaluate:
            cmd += ["eval", evaluate, *flags, "--no-record", "--json", str(out)]
        else:
            cmd += ["compress", model, "--quant", quant, *flags, "-o", str(out)]
        log = Path(tmp) / "log"
        t0 = time.perf_counter()
        with log.open("w") as f:  # a file: a pipe nobody reads would stall the progress bars
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=f)
            _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        if status != 0:
            raise SystemExit(f"{cmd[5]} failed: {log.read_text()[-2000:]}")
        digest = hashlib.sha256()
        if evaluate:
            result = json.loads(out.read_text())
            digest.update(json.dumps({k: result.get(k) for k in FIGURES}).encode())
        for f in sorted(out.glob("*.safetensors")) if not evaluate else []:
            digest.update(f.read_bytes())
    return {
        "wall_s": round(wall, 1),
        "user_s": round(usage.ru_utime, 1),
        "sys_s": round(usage.ru_stime, 1),
        "minor_faults": usage.ru_minflt,
        "peak_rss_mb": usage.ru_maxrss // 1024,
        "sha256": digest.hexdigest()[:16],
    }


def table(record: dict) -> str:
    lines = [
        "| setting | round | wall s | user s | sys s | minor faults (M) | peak RSS MB | sha256 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in record["runs"]:
        lines.append(
            f"| {r['setting']} | {r['round']} | {r['wall_s']} | {r['user_s']} | {r['sys_s']} "
            f"| {r['minor_faults'] / 1e6:.1f} | {r['peak_rss_mb']} | `{r['sha256']}` |"
        )
    lines += ["", "| setting | median wall s | median sys s |", "|---|---|---|"]
    for name in dict.fromkeys(r["setting"] for r in record["runs"]):
        runs = [r for r in record["runs"] if r["setting"] == name]
        wall = round(statistics.median(r["wall_s"] for r in runs), 1)
        sys_s = round(statistics.median(r["sys_s"] for r in runs), 1)
        lines.append(f"| {name} | {wall} | {sys_s} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--model", default="default")
    ap.add_argument("--quant", default="w4g64", help="the README's first compress: w4g64")
    ap.add_argument("--flags", default="", help="more compress flags, as one string")
    ap.add_argument("--eval", metavar="ARTIFACT", help="time `eval ARTIFACT --flags` instead")
    ap.add_argument("--label", help="the model's name in the results (default: --model)")
    ap.add_argument("--against", metavar="REV", help="compare REV's code with this checkout's")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "allocator_churn.json")
    args = ap.parse_args()
    runs = []
    with checkout(args.against) if args.against else nullcontext() as tree:
        sides = [(name, trim, ROOT) for name, trim in SETTINGS.items()]
        if args.against:
            sides = [(f"code of {args.against}", None, tree), ("this checkout", None, ROOT)]
        if args.eval:  # the original computed and cached before the timed runs
            run_once(None, args.model, args.quant, args.flags.split(), ROOT, args.eval)
        for r in range(args.rounds):
            for name, trim, code in sides:
                flags = args.flags.split()
                result = run_once(trim, args.model, args.quant, flags, code, args.eval)
                row = {"setting": name, "round": r + 1, **result}
                print(json.dumps(row), flush=True)
                runs.append(row)
    words = ["compress", args.label or args.model, "--quant", args.quant, args.flags]
    if args.eval:
        words = ["eval", args.label or args.eval, args.flags]
    command = " ".join(words).strip()
    if args.against:
        command += f" (against {args.against})"
    record = {"cpu": cpu_flags(), "threads": os.cpu_count(), "runs": runs}
    kept = json.loads(args.out.read_text()) if args.out.is_file() else {"commands": {}}
    kept["commands"][command] = record
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(kept, indent=2) + "\n")
    print(table(record))


if __name__ == "__main__":
    main()
