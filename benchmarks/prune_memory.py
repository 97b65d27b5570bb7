"""Peak memory of pruning a Mixture-of-Experts model's experts: block by block (what
`compress` does with a prune stage first) against the whole model in memory (the stage
after another model stage, and every prune before), by depth.

The checkpoints have Qwen3-30B-A3B's widths (hidden 2048, 128 experts of 768, top-8, 32
heads of 128, 4 KV heads, vocabulary 151,936, untied head) and random bf16 weights, at a
few depths (its 48 layers are 61 GB of bf16). Each prune (`experts: 0.25`, REAP's cut)
runs in a process of its own on the same calibration samples (WikiText-2 valid), its
peak RSS sampled as benchmarks/scale.py does; the two paths must keep the same experts.
Then `llmpress compress --recipe` (the prune, then rtn:w4g64) at each depth: what a user
runs.

    python benchmarks/prune_memory.py --depths 2,4,8 --memory-depths 2
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from random_checkpoint import SHAPES, parameters, write  # noqa: E402
from scale import DATA, LLMPRESS, measure  # noqa: E402

CUT = {"experts": 0.25}


def drive(path: str, src: Path, out: Path, samples: int, length: int) -> None:
    """One prune, in this process: `streamed` (from the checkpoint) or `memory` (the whole
    model loaded, as the stage does after another model stage); writes the record."""
    from compress.allocator import return_freed_memory
    from compress.artifact.dense import load_model
    from compress.calib_data import calibration_samples, read_texts, token_stream
    from compress.model.blocks import BlockStore
    from compress.model.loading import load_tokenizer, resolve
    from compress.pruning.stage import Prune, PruneConfig
    from compress.stage import ModelContext

    return_freed_memory()  # as the CLI does for compress, on both paths
    ckpt = resolve(str(src))
    tokenizer = load_tokenizer(ckpt)
    ids = calibration_samples(
        token_stream(tokenizer, read_texts(str(DATA / "valid.txt"))), samples, length, 0
    )
    stage = Prune(PruneConfig(**CUT))
    if path == "streamed":
        record, _ = stage.run_streamed(
            BlockStore(ckpt), ids, tokenizer, out / "model", ckpt.sha256, print
        )
    else:
        from compress.pipeline import _save_model

        model = load_model(ckpt)
        ctx = ModelContext(teacher=model, model=model, config=dict(ckpt.config),
                           adapter=ckpt.adapter, tokenizer=tokenizer, samples=ids,
                           work_dir=None, log=print)  # fmt: skip
        record = stage.run(ctx)
        state = {k: v.contiguous() for k, v in ctx.model.state_dict().items()}
        ctx.model = ctx.teacher = model = None
        out.mkdir(parents=True, exist_ok=True)
        _save_model(state, ctx.config, ckpt, tokenizer, out / "model")
    (out / "record.json").write_text(json.dumps(record["kept"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--depths", default="2,4,8")
    ap.add_argument("--memory-depths", default="2", help="depths the whole-model prune runs at")
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--work", type=Path, default=HERE / "work" / "prune_memory")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--name", default="prune_memory")
    ap.add_argument("--driver", nargs=3, metavar=("PATH", "SRC", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.driver:
        path, src, out = args.driver
        drive(path, Path(src), Path(out), args.samples, args.length)
        return
    tokenizer = _default_tokenizer()
    rows = []
    memory_depths = {int(d) for d in args.memory_depths.split(",") if d}
    for depth in (int(d) for d in args.depths.split(",")):
        shape = replace(SHAPES["qwen3-30b-a3b"], layers=depth)
        shutil.rmtree(args.work, ignore_errors=True)
        src = write(shape, args.work / "src", tokenizer)
        size = sum(f.stat().st_size for f in src.glob("*.safetensors"))
        row = {
            "layers": depth,
            "parameters": parameters(shape),
            "checkpoint_gb": round(size / 1e9, 2),
        }
        kept = {}
        for path in ("streamed", "memory") if depth in memory_depths else ("streamed",):
            out = args.work / path
            cmd = [sys.executable, __file__, "--samples", str(args.samples), "--length",
                   str(args.length), "--driver", path, str(src), str(out)]  # fmt: skip
            row[path] = measure(cmd, args.work / f"{path}.log")
            kept[path] = json.loads((out / "record.json").read_text())
            shutil.rmtree(out)
        if len(kept) == 2:
            row["same_units_kept"] = kept["streamed"] == kept["memory"]
        recipe = args.work / "recipe.yaml"
        recipe.write_text(
            json.dumps({"stages": [{"prune": CUT}, {"rtn": {"bits": 4, "group_size": 64}}]})
        )
        cmd = [*LLMPRESS, "compress", str(src), "-o", str(args.work / "w4"), "--recipe",
               str(recipe), "--calib", str(DATA / "valid.txt"), "--calib-samples",
               str(args.samples), "--calib-len", str(args.length)]  # fmt: skip
        row["compress"] = measure(cmd, args.work / "compress.log")
        manifest = json.loads((args.work / "w4" / "manifest.json").read_text())
        row["compress"]["timing_s"] = manifest.get("timing_s", {})
        print(json.dumps(row), flush=True)
        rows.append(row)
    shutil.rmtree(args.work, ignore_errors=True)
    record = {
        "command": f"python benchmarks/prune_memory.py --depths {args.depths} --memory-depths "
        f"{args.memory_depths}",  # the figures' arguments, not where this run kept its files
        "shape": "Qwen3-30B-A3B widths, random bf16 weights, at each depth",
        "cut": CUT,
        "calibration": {"samples": args.samples, "length": args.length},
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(record, indent=2) + "\n")


def _default_tokenizer() -> Path:
    """The default model's tokenizer folder (its vocabulary is a prefix of 151,936)."""
    from compress.model.default import convert_gguf, default_gguf

    return convert_gguf(default_gguf())


if __name__ == "__main__":
    main()
