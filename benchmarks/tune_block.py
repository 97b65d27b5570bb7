"""Block-wise tuning's settings, one block at a time (issue 16): how much of a block's
output error each setting takes away, on the samples it trained on and on held-out ones.

A whole-chain row of benchmarks/quality.py costs half an hour; this isolates tune. For
each block asked, the original model's hidden states entering it (calibration samples of
WikiText-2 valid.txt: the first `--samples` train, the next `--held` are held out) go
through the block quantized RTN w4 g64, then tuned toward the block as read
(`target: block`) with each setting. Reported: the output error after tuning as a
fraction of RTN's (relative MSE), on the first 16 training samples and on the held-out
ones, and the seconds tuning took.

    python benchmarks/tune_block.py [--blocks 3 11] [--samples 128] [--held 16]
        [--settings steps=100,batch=2,lr=0.005,schedule=constant steps=200,batch=1 ...]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from wikitext import DATA, require

from compress.calib_data import calibration_samples, read_texts, token_stream
from compress.model.blocks import BlockStore, run_block
from compress.model.loading import load_tokenizer, resolve
from compress.quantizers.rtn import RTN, RTNConfig
from compress.quantizers.tune import Tune, TuneConfig
from compress.stage import BlockContext, Workspace

HERE = Path(__file__).resolve().parent
INTS = ("steps", "batch", "samples", "seed", "positions")
DEFAULT_SETTINGS = [  # the defaults last; the others the earlier defaults and neighbours
    "steps=100,batch=2,lr=0.005,schedule=constant",
    "steps=100,batch=2,lr=0.01,schedule=constant",
    "steps=100,batch=2,lr=0.02",
    "steps=100,batch=2,lr=0.03",
    "steps=200,batch=2,lr=0.02",
    "steps=200,batch=1,lr=0.01",
    "steps=200,batch=1,lr=0.02",
]


def parse_setting(text: str) -> dict:
    """`lr=0.02,schedule=linear,steps=100,batch=2` → TuneConfig keyword arguments."""
    out = {}
    for part in filter(None, text.split(",")):
        key, value = part.split("=", 1)
        out[key] = value if key == "schedule" else (int(value) if key in INTS else float(value))
    return out


def relative_error(block, x, target, rope) -> float:
    return float((run_block(block, x, rope) - target).pow(2).mean() / target.pow(2).mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", type=int, nargs="+", default=[3, 11])
    ap.add_argument("--samples", type=int, default=128)
    ap.add_argument("--held", type=int, default=16)
    ap.add_argument("--settings", nargs="+", default=DEFAULT_SETTINGS)
    ap.add_argument("--name", default="tune_block", help="results file stem")
    args = ap.parse_args()
    require(DATA, "valid.txt")
    torch.manual_seed(0)
    ckpt = resolve("default")
    tokenizer = load_tokenizer(ckpt)
    stream = token_stream(tokenizer, read_texts(str(DATA / "valid.txt")))
    ids = calibration_samples(stream, args.samples + args.held, 512, seed=0)
    store = BlockStore(ckpt)
    hidden, rope = store.embed(ids), store.position_embeddings(ids.shape[1])
    rows = []
    for i in range(max(args.blocks) + 1):
        block = store.block(i)
        if i in args.blocks:
            train, held = hidden[: args.samples], hidden[args.samples :]
            ref_train, ref_held = run_block(block, train, rope), run_block(block, held, rope)
            for text in args.settings:
                ws = Workspace(BlockStore(ckpt), tokenizer)
                tuned = ws.store.block(i)
                ctx = BlockContext(ws, i, tuned, train, rope, reference=ref_train)
                RTN(RTNConfig(bits=4, group_size=64)).transform(ctx)
                start = (
                    relative_error(tuned, train[:16], ref_train[:16], rope),
                    relative_error(tuned, held, ref_held, rope),
                )
                started = time.perf_counter()
                Tune(TuneConfig(target="block", **parse_setting(text))).transform(ctx)
                seconds = time.perf_counter() - started
                end = (
                    relative_error(tuned, train[:16], ref_train[:16], rope),
                    relative_error(tuned, held, ref_held, rope),
                )
                row = {
                    "block": i,
                    "setting": text,
                    "train": round(end[0] / start[0], 3),
                    "held_out": round(end[1] / start[1], 3),
                    "rtn_error": [start[0], start[1]],
                    "seconds": round(seconds, 1),
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
        hidden = run_block(block, hidden, rope)
    lines = [
        "| block | setting | error left, training | error left, held out | seconds |",
        "|---|---|---|---|---|",
        *(
            f"| {r['block']} | {r['setting']} | {r['train']:.3f} | {r['held_out']:.3f} | "
            f"{r['seconds']:.0f} |"
            for r in rows
        ),
    ]
    meta = {"samples": args.samples, "held": args.held, "scheme": "rtn w4g64 symmetric"}
    out = HERE / "results" / args.name
    out.with_suffix(".json").write_text(json.dumps({**meta, "rows": rows}, indent=2))
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
