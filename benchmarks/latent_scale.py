"""Multi-head latent attention at a published model's widths: compress and eval, peak
memory and time per block.

DeepSeek-V2-Lite's shape (DeepSeek-Coder-V2-Lite's too): hidden 2048, 16 heads through
one latent of 512 (nope 128, rope 64, v 128; q through one q_proj), 64 experts of 1408
with 6 a token and two shared, the first layer dense (10944), vocabulary 102,400. Random
bf16 weights, written tensor by tensor (random_checkpoint.py's writer; every tensor name
and shape from transformers' own model of the config), at a reduced depth: memory and
time per block do not depend on depth. Each command runs in its own process (scale.py's
measure: peak RSS, wall time):
- `llmpress compress --quant METHOD:w4g64` (awq and gptq with a few samples of
  WikiText-2 valid; rtn reads none);
- `llmpress eval --engine transformers` of the rtn artifact against the original, twice
  (the second reads the original's cached figures): the runtime refuses latent attention.

    python benchmarks/latent_scale.py [--layers 4] [--methods rtn,gptq] [--keep]

Quality figures of random weights mean nothing and are left out.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from batched_decode import cpu_flags  # noqa: E402
from random_checkpoint import config_shapes, write_config  # noqa: E402
from scale import DATA, compress, evaluate, fresh_eval_cache  # noqa: E402

DEEPSEEK_V2_LITE = {
    "architectures": ["DeepseekV2ForCausalLM"],
    "model_type": "deepseek_v2",
    "hidden_size": 2048,
    "intermediate_size": 10944,
    "moe_intermediate_size": 1408,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "n_routed_experts": 64,
    "n_shared_experts": 2,
    "num_experts_per_tok": 6,
    "first_k_dense_replace": 1,
    "kv_lora_rank": 512,
    "q_lora_rank": None,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "topk_method": "greedy",
    "n_group": 1,
    "topk_group": 1,
    "norm_topk_prob": False,
    "routed_scaling_factor": 1.0,
    "vocab_size": 102400,
    "max_position_embeddings": 163840,
    "rms_norm_eps": 1e-6,
    "rope_scaling": {
        "type": "yarn",
        "factor": 40,
        "original_max_position_embeddings": 4096,
        "beta_fast": 32,
        "beta_slow": 1,
        "mscale": 0.707,
        "mscale_all_dim": 0.707,
    },
    "rope_theta": 10000,
    "tie_word_embeddings": False,
    "bos_token_id": 100000,
    "eos_token_id": 100001,
    "torch_dtype": "bfloat16",
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=4, help="depth (the first one dense)")
    ap.add_argument("--methods", default="rtn,gptq")
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--work", type=Path, default=HERE / "work" / "latent_scale")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--name", default="latent_scale")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    if not (DATA / "valid.txt").is_file():
        raise SystemExit(f"{DATA} is missing: calibration and eval read WikiText-2")
    from compress.model.default import convert_gguf, default_gguf

    shutil.rmtree(args.work, ignore_errors=True)
    logs = args.work / "logs"
    logs.mkdir(parents=True)
    config = {**DEEPSEEK_V2_LITE, "num_hidden_layers": args.layers}
    t0 = time.perf_counter()
    src = write_config(config, args.work / "src", convert_gguf(default_gguf()))
    shapes = config_shapes(config)
    params = sum(math.prod(d) for d in shapes.values())
    blocks = sum(math.prod(d) for n, d in shapes.items() if n.startswith("model.layers.1."))
    record = {
        "command": "python benchmarks/latent_scale.py"
        + (f" --layers {args.layers}" if args.layers != 4 else ""),
        "cpu": cpu_flags(),
        "threads": os.cpu_count(),
        "shape": "deepseek-v2-lite",
        "layers": args.layers,
        "params_b": round(params / 1e9, 2),
        "moe_block_params_b": round(blocks / 1e9, 3),
        "write_s": round(time.perf_counter() - t0, 1),
        "calibration": {"samples": args.samples, "length": args.length},
        "compress": {},
    }
    for method in args.methods.split(","):
        out = args.work / f"w4-{method}"
        row = compress(src, out, method, args.samples, args.length, logs)
        record["compress"][method] = row
        print(method, row, flush=True)
        if method != "rtn":
            shutil.rmtree(out)
    cache = fresh_eval_cache(args.work)
    art = args.work / "w4-rtn"
    transformers = ("--engine", "transformers")  # the runtime refuses latent attention
    record["eval_first"] = evaluate(src, art, logs, "first", cache, *transformers)
    record["eval_cached"] = evaluate(src, art, logs, "cached", cache, *transformers)
    print(record["eval_first"], record["eval_cached"], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(record, indent=1) + "\n")
    if not args.keep:
        shutil.rmtree(args.work)


if __name__ == "__main__":
    main()
