"""One process against torchrun ranks: time, and whether they write the same artifact.

The default model, `compress --quant METHOD:w4g64` on WikiText-2 valid, run once in one
process and once as `torchrun --nproc-per-node N -m compress compress ...` (gloo on CPU),
interleaved `--rounds` times; the artifacts are compared tensor by tensor.

    python benchmarks/distributed.py [--method gptq] [--ranks 2] [--samples 32] [--length 512]

On a machine of 2 cores the ranks share those cores (torchrun gives each one thread where
one process takes two), so the figure shows that the ranks compute the one-process
artifact, not a speedup.
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
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                str(args.ranks), "-m", "compress"]  # fmt: skip
    runs: dict[str, list[dict]] = {"1 process": [], f"{args.ranks} ranks": []}
    for _ in range(args.rounds):
        one, many = args.work / "one", args.work / "ranks"
        runs["1 process"].append(measure([*LLMPRESS, *common, "-o", str(one)],
                                         args.work / "one.log"))  # fmt: skip
        port = ["--master-port", str(free_port())]
        cmd = [*torchrun[:4], *port, *torchrun[4:], *common, "-o", str(many)]
        runs[f"{args.ranks} ranks"].append(measure(cmd, args.work / "ranks.log"))
        print(runs, flush=True)
    record = {
        "command": "python benchmarks/distributed.py " + " ".join(sys.argv[1:]),
        "cpu": cpu_flags(),
        "threads": os.cpu_count(),
        "method": f"{args.method}:w4g64",
        "calibration": {"samples": args.samples, "length": args.length},
        "wall_s": {k: [r["wall_s"] for r in v] for k, v in runs.items()},
        "compared": compare(one, many),
    }
    print(record, flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    shutil.rmtree(args.work)


if __name__ == "__main__":
    main()
