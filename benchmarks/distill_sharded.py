"""The distillation repair in one process, and under torchrun as DDP and as FSDP: the
memory each rank holds while it trains, and whether the steps agree.

The default model pruned (`prune: {mlp: 0.5}`) and repaired (`distill`) on WikiText-2
valid, three ways: one process; `torchrun --nproc-per-node N` with `distill.parallel:
ddp` (each rank holds the teacher, the student, its gradients and Adam's moments whole);
and with `fsdp` (each rank holds 1/N of each, gathering a block's weights at a time).
Reported from rank 0's manifest: its resident memory right after the last step
(`training_rss_mb`, before the models are whole again for the later stages and the
writer), its peak (loading included), wall time, and the repair's losses against the one
process's.

    python benchmarks/distill_sharded.py [--ranks 2] [--steps 8] [--length 256]

On 2 cores the times show correctness, not speed: each rank runs one thread.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from batched_decode import cpu_flags  # noqa: E402
from distributed import free_port  # noqa: E402
from scale import DATA, LLMPRESS, measure  # noqa: E402


def recipe(parallel: str, steps: int, batch: int, length: int, samples: int) -> dict:
    return {
        "stages": [
            {"prune": {"mlp": 0.5}},
            {"distill": {"tokens": steps * batch * length, "batch": batch,
                         "parallel": parallel}},
        ],
        "calib": {"source": str(DATA / "valid.txt"), "samples": samples, "length": length},
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--work", type=Path, default=HERE / "work" / "distill_sharded")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "distill_sharded.json")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    runs = {"1 process": "auto", f"{args.ranks} ranks, ddp": "ddp",
            f"{args.ranks} ranks, fsdp": "fsdp"}  # fmt: skip
    rows = {}
    for name, parallel in runs.items():
        path = args.work / f"{parallel}.json"
        path.write_text(json.dumps(recipe(parallel, args.steps, args.batch, args.length,
                                          args.samples)))  # fmt: skip
        out = args.work / parallel
        common = ["compress", "default", "--recipe", str(path), "-o", str(out), "--device",
                  "cpu", "--overwrite"]  # fmt: skip
        if parallel == "auto":
            env = {**os.environ, "OMP_NUM_THREADS": "1"}  # as each rank runs
            cmd = [*LLMPRESS, *common]
        else:
            env = None
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                   str(args.ranks), "--master-port", str(free_port()), "-m", "compress",
                   *common]  # fmt: skip
        run = measure(cmd, args.work / f"{parallel}.log", env)
        manifest = json.loads((out / "manifest.json").read_text())
        stage = next(s for s in manifest["stages"] if s["stage"] == "distill")
        rows[name] = {
            "parallel": stage["parallel"],
            "training_rss_mb": stage["training_rss_mb"],
            "peak_rss_mb": stage["peak_rss_mb"],
            "wall_s": run["wall_s"],
            "losses": [kl for _, kl in stage["loss_history"]],
        }
        print(name, rows[name], flush=True)
    one = rows["1 process"]["losses"]
    for row in rows.values():
        row["max_loss_diff"] = max(abs(a - b) for a, b in zip(row["losses"], one, strict=True))
    record = {
        "command": "python benchmarks/distill_sharded.py " + " ".join(sys.argv[1:]),
        "cpu": cpu_flags(),
        "threads": os.cpu_count(),
        "recipe": recipe("…", args.steps, args.batch, args.length, args.samples),
        "rows": rows,
    }
    record["recipe"]["calib"]["source"] = "WikiText-2 valid.txt"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    shutil.rmtree(args.work)


if __name__ == "__main__":
    main()
