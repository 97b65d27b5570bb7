"""Where a served stream's events are written: on a thread of their own beside the next
decode step (serve's default, compress/serve/pump.Writer) or on the engine's thread
between steps (`Writer.threaded = False`), alternating in one server so that the shared
host's drift falls on both alike.

For each capacity C (default 1, 8, 32) a server runs the w4 artifact serve_load.py uses
(RTN g64 zero point, lm_head int8); C clients in a process of their own each send one
streaming completion (serve_load's prompts, 64 tokens out, greedy, `ignore_eos`), the two
ways taking turns, ABBA, for `--rounds` pairs. Reported: each way's median output
tokens/s and p50 TTFT, and the median of the pairs' ratios (threaded over inline) with
how many pairs the threaded way won.

    python benchmarks/serve_writer.py [--capacities 1,8,32] [--rounds 16]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import statistics
import sys
import tempfile
import threading
from pathlib import Path

import torch

from compress.kernels.cpu import set_threads
from compress.pipeline import compress
from compress.recipe import parse_quant, parse_recipe
from compress.serve.app import build_app
from compress.serve.server import make_server

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from batched_decode import cpu_flags  # noqa: E402
from serve_load import load_row, run_clients  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--capacities", default="1,8,32")
    ap.add_argument("--rounds", type=int, default=16, help="pairs of runs per capacity")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()
    set_threads(torch.get_num_threads())
    clients = multiprocessing.get_context("spawn").Pool(1)  # the clients' own process
    rows = {}
    with clients, tempfile.TemporaryDirectory() as tmp:
        art = Path(tmp) / "w4"
        recipe = parse_recipe({"stages": [parse_quant("rtn:w4g64zp")], "lm_head": "w8"})
        compress("default", recipe, art, log=lambda _: None)
        for cap in [int(c) for c in args.capacities.split(",")]:
            app = build_app(str(art), max_batch=cap, max_len=256, max_queue=cap)
            httpd = make_server(app, "127.0.0.1", 0)
            port = httpd.server_address[1]
            threading.Thread(target=httpd.serve_forever, daemon=True).start()
            clients.apply(run_clients, (port, 1, 8, 60))  # warm-up
            runs = {True: [], False: []}
            for i in range(args.rounds):
                for threaded in (True, False) if i % 2 == 0 else (False, True):
                    app.scheduler.writer.threaded = threaded
                    out, wall, hung = clients.apply(run_clients, (port, cap, args.tokens, 120))
                    runs[threaded].append(load_row(cap, cap, out, wall, hung))
            httpd.shutdown()
            httpd.server_close()
            app.scheduler.stop()
            ratios = [
                a["output_tokens_per_s"] / b["output_tokens_per_s"]
                for a, b in zip(runs[True], runs[False], strict=True)
            ]
            rows[cap] = {
                way: {
                    "tok_s": statistics.median(r["output_tokens_per_s"] for r in runs[t]),
                    "ttft_p50": statistics.median(r["ttft_p50"] for r in runs[t]),
                    "hung": sum(r["hung"] for r in runs[t]),
                }
                for way, t in (("threaded", True), ("inline", False))
            }
            wins = sum(x > 1 for x in ratios)
            rows[cap].update(ratio=statistics.median(ratios), wins=wins, ratios=ratios)
            print(json.dumps({"capacity": cap, **rows[cap]}), flush=True)
    record = {
        "benchmark": "serve_writer",
        "machine": {
            "platform": platform.platform(),
            "cpu": cpu_flags(),
            "threads": torch.get_num_threads(),
        },
        "tokens": args.tokens,
        "rounds": args.rounds,
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "serve_writer.json").write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
