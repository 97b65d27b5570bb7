"""Where one step of tune's training goes, on one block of the default model.

tune's time (the largest share of `best:w4g64`) is its steps: each step builds the
fake-quantized weights, runs the block forward and backward on one 512-token sample,
then Adam and the clamp of the rounding offsets. This times each part (milliseconds,
mean of `--repeat` after a warm-up) on block 0 after RTN w4g64, and the block's
forward-and-backward compute rate.

    python benchmarks/tune_step.py [--repeat 10]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from torch.func import functional_call
from wikitext import DATA, require

from compress.calib_data import calibration_samples, read_texts, token_stream
from compress.model.blocks import BlockStore, run_block
from compress.model.loading import load_tokenizer, resolve
from compress.quantizers.rtn import RTN, RTNConfig
from compress.quantizers.tune import _Tunable
from compress.stage import BlockContext, Workspace

HERE = Path(__file__).resolve().parent


def timed(fn, repeat: int) -> float:
    fn()
    started = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - started) / repeat * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=10)
    args = ap.parse_args()
    require(DATA, "valid.txt")
    ckpt = resolve("default")
    tokenizer = load_tokenizer(ckpt)
    stream = token_stream(tokenizer, read_texts(str(DATA / "valid.txt")))
    ids = calibration_samples(stream, 2, 512, seed=0)
    ws = Workspace(BlockStore(ckpt), tokenizer)
    hidden, rope = ws.store.embed(ids), ws.store.position_embeddings(512)
    block = ws.store.block(0)
    target = run_block(block, hidden, rope)
    ctx = BlockContext(ws, 0, block, hidden, rope, reference=target)
    RTN(RTNConfig(bits=4, group_size=64)).transform(ctx)
    tunables = {
        rel: _Tunable(ws.quantized[f"{ctx.prefix}.{rel}"], ctx.unrounded[rel], True)
        for rel in ctx.targets()
    }
    params = [p for t in tunables.values() for p in t.params()]
    block.requires_grad_(False)
    x, y = hidden[:1], target[:1]

    def weights():
        return {f"{rel}.weight": t.weight(torch.float32) for rel, t in tunables.items()}

    def weights_only():
        sum(w.sum() for w in weights().values()).backward()

    fixed = {k: v.detach().clone().requires_grad_(True) for k, v in weights().items()}

    def block_only():
        out = functional_call(block, fixed, (x,), {"position_embeddings": rope})
        (out - y).pow(2).mean().backward()

    def whole():
        out = functional_call(block, weights(), (x,), {"position_embeddings": rope})
        (out - y).pow(2).mean().backward()

    adam = torch.optim.Adam(params, 0.02)
    fused = torch.optim.Adam(params, 0.02, fused=True)
    whole()
    ms = {
        "fake-quantized weights, forward and backward": timed(weights_only, args.repeat),
        "block forward and backward (plain weights)": timed(block_only, args.repeat),
        "both, as a step computes them": timed(whole, args.repeat),
        "Adam": timed(adam.step, args.repeat),
        "Adam, fused=True": timed(fused.step, args.repeat),
        "clamp": timed(lambda: [t.clamp_() for t in tunables.values()], args.repeat),
    }
    linear = sum(p.numel() for n, p in block.named_parameters() if n.endswith("proj.weight"))
    flops = 3 * 2 * 512 * linear  # forward, and backward's two products per linear
    rate = flops / (ms["both, as a step computes them"] / 1000) / 1e9
    lines = ["| part of one tune step (block 0, one 512-token sample) | ms |", "|---|---|"]
    lines += [f"| {k} | {v:.1f} |" for k, v in ms.items()]
    lines += ["", f"linear compute of a step: {flops / 1e9:.1f} GFLOP, {rate:.0f} GFLOP/s"]
    out = HERE / "results" / "tune_step"
    record = {"ms": ms, "gflop": flops / 1e9, "gflop_s": rate, "threads": torch.get_num_threads()}
    out.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
