"""One process against torchrun ranks: time, and whether they write the same artifact.

The default model, `compress --quant METHOD:w4g64` on WikiText-2 valid, run once in one
process and once as `torchrun --nproc-per-node N -m compress compress ...` (gloo on CPU),
interleaved `--rounds` times; the artifacts are compared tensor by tensor.

    python benchmarks/distributed.py [--method gptq] [--ranks 2] [--samples 32] [--length 512]

torchrun gives each rank one thread; the single process runs with one thread (the same
sums in the same order as each rank: the artifacts must be equal) and with every core
(BLAS then splits its sums otherwise, and the last bits move). On 2 cores the figure shows
correctness and the scaling of ranks at one thread each, not what many cores would give.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from batched_decode import cpu_flags  # noqa: E402
from device_compress import compare  # noqa: E402
from scale import DATA, LLMPRESS, measure  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--method", default="gptq")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--length", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--work", type=Path, default=HERE / "work" / "distributed")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "distributed.json")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    common = ["compress", "default", "--quant", f"{args.method}:w4g64", "--calib",
              str(DATA / "valid.txt"), "--calib-samples", str(args.samples), "--calib-len",
              str(args.length), "--device", "cpu", "--overwrite"]  # fmt: skip
    threads = os.cpu_count()
    single = {1: "1 process, 1 thread", threads: f"1 process, {threads} threads"}
    ranks = f"{args.ranks} ranks, 1 thread each"
    runs: dict[str, list[dict]] = {name: [] for name in [*single.values(), ranks]}
    outs = {name: args.work / name.replace(" ", "").replace(",", "-") for name in runs}
    for _ in range(args.rounds):
        for n, name in single.items():
            env = {**os.environ, "OMP_NUM_THREADS": str(n)}
            cmd = [*LLMPRESS, *common, "-o", str(outs[name])]
            runs[name].append(measure(cmd, args.work / "one.log", env))
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
               str(args.ranks), "--master-port", str(free_port()), "-m", "compress", *common,
               "-o", str(outs[ranks])]  # fmt: skip
        runs[ranks].append(measure(cmd, args.work / "ranks.log"))  # torchrun: 1 thread a rank
        print(runs, flush=True)
    record = {
        "command": "python benchmarks/distributed.py " + " ".join(sys.argv[1:]),
        "cpu": cpu_flags(),
        "threads": os.cpu_count(),
        "method": f"{args.method}:w4g64",
        "calibration": {"samples": args.samples, "length": args.length},
        "wall_s": {k: [r["wall_s"] for r in v] for k, v in runs.items()},
        # with as many threads per process, the same sums in the same order: bit for bit;
        # BLAS splits a product's sums by thread count, so another count moves last bits
        "compared": {name: compare(outs[name], outs[ranks]) for name in single.values()},
    }
    print(record, flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    shutil.rmtree(args.work)


if __name__ == "__main__":
    main()
