"""Multi-head latent attention at a published model's widths: compress, eval and decode,
peak memory, time per block, tok/s and MBU.

Two shapes, at a reduced depth (memory and time per block do not depend on depth):
- DeepSeek-V2-Lite's (DeepSeek-Coder-V2-Lite's too): hidden 2048, 16 heads through one
  latent of 512 (nope 128, rope 64, v 128; q through one q_proj), 64 experts of 1408
  with 6 a token and two shared, the first layer dense (10944), vocabulary 102,400;
- GLM-4.7-Flash's: hidden 2048, 20 heads, q through a rank of 768, a latent of 512
  (nope 192, rope 64, v 256), 64 experts of 1536 with 4 a token and one shared, sigmoid
  routing, the first layer dense (10240), vocabulary 154,880.

Random bf16 weights, written tensor by tensor (random_checkpoint.py's writer; every
tensor name and shape from transformers' own model of the config). Each command runs in
its own process (scale.py's measure: peak RSS, wall time):
- `llmpress compress --quant METHOD:w4g64` (awq and gptq with a few samples of
  WikiText-2 valid; rtn reads none);
- `llmpress eval` of the rtn artifact against the original through the runtime, twice
  (the second reads the original's cached figures), and once with `--engine
  transformers`, which holds the artifact whole in fp32;
- `compress` with a prune stage (a quarter of the experts and of each one's width, the
  latent attention kept whole) then rtn:w4g64, scored on a few samples (`--no-prune`
  skips it);
- `llmpress bench --batch 1` of the rtn artifact (the runtime caches the latent once a
  token, in the one-call C decoder; latent_cache.py compares it with every head's k and v);
- with `--llama-cpp BIN` (scripts/build_llama_cpp prints it): llama.cpp's own converter
  and `llama-quantize Q4_0` on the same checkpoint, `llama-bench -t 2 -p 0 -n 64`, in
  rounds interleaved with `llmpress bench` (medians; benchmarks/families.py's anchor).
  Runs for the GLM-4.7-Flash shape; llama.cpp's loader takes a deepseek2 file without
  q_lora_rank for V2-Lite only at V2-Lite's own depth (27 layers), so not at 4.

    python benchmarks/latent_scale.py [--shape deepseek-v2-lite|glm-4.7-flash]
        [--layers 4] [--methods rtn,awq,gptq] [--llama-cpp BIN] [--rounds 3] [--keep]

Quality figures of random weights mean nothing and are left out.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from batched_decode import cpu_flags  # noqa: E402
from random_checkpoint import config_shapes, write_config  # noqa: E402
from scale import DATA, LLMPRESS, bench, compress, evaluate, fresh_eval_cache, measure  # noqa: E402

# pruning's experts and MLP widths (the latent attention stays whole), then 4 bits
PRUNE = {"prune": {"experts": 0.25, "mlp": 0.25}}


def prune(src: Path, out: Path, samples: int, length: int, logs: Path) -> dict:
    """`compress` with PRUNE then rtn:w4g64 (its widths in whole groups of 64): peak RSS,
    wall time, time per block and the shape it left."""
    recipe = logs / "prune.yaml"
    recipe.write_text(json.dumps({"stages": [PRUNE, {"rtn": {"bits": 4, "group_size": 64}}]}))
    cmd = [*LLMPRESS, "compress", str(src), "-o", str(out), "--recipe", str(recipe),
           "--calib", str(DATA / "valid.txt"), "--calib-samples", str(samples),
           "--calib-len", str(length)]  # fmt: skip
    row = measure(cmd, logs / "compress-prune.log")
    manifest = json.loads((out / "manifest.json").read_text())
    record = manifest["stages"][0]
    layers = json.loads((src / "config.json").read_text())["num_hidden_layers"]
    row.update(
        recipe=[PRUNE, "rtn:w4g64"],
        shape_after={k: record["shape_after"][k] for k in ("experts", "intermediate")},
        non_embedding_params=record["non_embedding_params"],
        timing_s=manifest.get("timing_s", {}),
        prune_s=record["seconds"],
        s_per_block=round(manifest.get("timing_s", {}).get("rtn transform", 0) / layers, 2),
        artifact_gb=round(sum(f.stat().st_size for f in out.iterdir()) / 1e9, 2),
    )
    return row


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


GLM_47_FLASH = {
    "architectures": ["Glm4MoeLiteForCausalLM"],
    "model_type": "glm4_moe_lite",
    "hidden_size": 2048,
    "intermediate_size": 10240,
    "moe_intermediate_size": 1536,
    "num_attention_heads": 20,
    "num_key_value_heads": 20,
    "n_routed_experts": 64,
    "n_shared_experts": 1,
    "num_experts_per_tok": 4,
    "kv_lora_rank": 512,
    "q_lora_rank": 768,
    "qk_nope_head_dim": 192,
    "qk_rope_head_dim": 64,
    "v_head_dim": 256,
    "n_group": 1,
    "topk_group": 1,
    "norm_topk_prob": True,
    "routed_scaling_factor": 1.8,
    "vocab_size": 154880,
    "max_position_embeddings": 202752,
    "rms_norm_eps": 1e-5,
    "rope_theta": 1000000,
    "rope_interleave": True,
    "tie_word_embeddings": False,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "torch_dtype": "bfloat16",
}

SHAPES = {"deepseek-v2-lite": DEEPSEEK_V2_LITE, "glm-4.7-flash": GLM_47_FLASH}


def llama_cpp_q4_0(bin_dir: Path, src: Path, work: Path) -> Path:
    """llama.cpp's own converter and Q4_0 of the checkpoint (families.llama_cpp_gguf)."""
    from families import CONVERT, llama_cpp_gguf

    # the checkpoint carries the default model's tokenizer, which llama.cpp's GLM vocab
    # reader refuses (no [gMASK]): read it as the other shapes' (decode speed is the same)
    convert = CONVERT.replace(
        "import convert_hf_to_gguf\n",
        "import convert_hf_to_gguf\nimport conversion.glm\n"
        "conversion.glm.Glm4MoeLiteModel.set_vocab = lambda self: self._set_vocab_gpt2()\n",
    )
    return llama_cpp_gguf(bin_dir, src, work, convert)


def llama_cpp_build() -> str:
    """How the llama.cpp in use was built: scripts/build_llama_cpp, with LLAMA_CFLAGS."""
    flags = os.environ.get("LLAMA_CFLAGS", "")
    return "scripts/build_llama_cpp (Release, GGML_NATIVE=ON" + (f", {flags})" if flags else ")")


def llama_cpp_anchor(bin_dir: Path, src: Path, art: Path, work: Path, rounds: int) -> dict:
    """llama.cpp Q4_0 of the same checkpoint against the rtn artifact, interleaved rounds
    of batch-1 decoding (medians)."""
    from families import bench_cli, llama_bench

    gguf = llama_cpp_q4_0(bin_dir, src, work)
    runs: dict[str, list[float]] = {"llmpress rtn:w4g64": [], "llama.cpp Q4_0": []}
    for r in range(rounds):
        runs["llmpress rtn:w4g64"].append(round(bench_cli(art, work)[0], 1))
        runs["llama.cpp Q4_0"].append(round(llama_bench(bin_dir, gguf), 1))
        print(f"round {r + 1}: {runs}", flush=True)
    med = {k: statistics.median(v) for k, v in runs.items()}
    return {
        "build": llama_cpp_build(),
        "bench": "llama-bench -t 2 -p 0 -n 64 -r 1; llmpress bench --batch 1 --output-len 128",
        "runs_tok_s": runs,
        "median_tok_s": med,
        "ratio": round(med["llmpress rtn:w4g64"] / med["llama.cpp Q4_0"], 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=list(SHAPES), default="deepseek-v2-lite")
    ap.add_argument("--layers", type=int, default=4, help="depth (the first one dense)")
    ap.add_argument("--methods", default="rtn,awq,gptq")
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--work", type=Path, default=HERE / "work" / "latent_scale")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--name", default=None, help="default: latent_scale[_SHAPE]")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--llama-cpp", type=Path, help="folder with llama-bench and llama-quantize")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds with llama.cpp")
    ap.add_argument("--no-prune", dest="prune", action="store_false", help="skip PRUNE's row")
    args = ap.parse_args()
    if not (DATA / "valid.txt").is_file():
        raise SystemExit(f"{DATA} is missing: calibration and eval read WikiText-2")
    from compress.model.default import convert_gguf, default_gguf

    shutil.rmtree(args.work, ignore_errors=True)
    logs = args.work / "logs"
    logs.mkdir(parents=True)
    # the first layer dense (GLM's as llama.cpp's converter reads it, first_k_dense_replace)
    config = {**SHAPES[args.shape], "num_hidden_layers": args.layers, "first_k_dense_replace": 1}
    if args.shape == "glm-4.7-flash":
        config["mlp_layer_types"] = ["dense"] + ["sparse"] * (args.layers - 1)
    name = args.name or "latent_scale" + ("" if args.shape == "deepseek-v2-lite" else "_glm")
    t0 = time.perf_counter()
    src = write_config(config, args.work / "src", convert_gguf(default_gguf()))
    shapes = config_shapes(config)
    params = sum(math.prod(d) for d in shapes.values())
    blocks = sum(math.prod(d) for n, d in shapes.items() if n.startswith("model.layers.1."))
    record = {
        "command": "python benchmarks/latent_scale.py"
        + (f" --shape {args.shape}" if args.shape != "deepseek-v2-lite" else "")
        + (f" --layers {args.layers}" if args.layers != 4 else "")
        + (f" --methods {args.methods}" if args.methods != "rtn,awq,gptq" else ""),
        "cpu": cpu_flags(),
        "threads": os.cpu_count(),
        "shape": args.shape,
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
    if args.prune:
        record["prune"] = prune(src, args.work / "pruned", args.samples, args.length, logs)
        print("prune", record["prune"], flush=True)
        shutil.rmtree(args.work / "pruned")
    cache = fresh_eval_cache(args.work)
    art = args.work / "w4-rtn"
    record["eval_first"] = evaluate(src, art, logs, "first", cache)
    record["eval_cached"] = evaluate(src, art, logs, "cached", cache)
    print(record["eval_first"], record["eval_cached"], flush=True)
    transformers = fresh_eval_cache(args.work / "transformers")
    record["eval_transformers"] = evaluate(
        src, art, logs, "first", transformers, "--engine", "transformers"
    )
    print(record["eval_transformers"], flush=True)
    record["bench"] = bench(art, logs)
    print(record["bench"], flush=True)
    if args.llama_cpp:
        record["llama_cpp"] = llama_cpp_anchor(args.llama_cpp, src, art, args.work, args.rounds)
        print(record["llama_cpp"], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{name}.json").write_text(json.dumps(record, indent=1) + "\n")
    if not args.keep:
        shutil.rmtree(args.work)


if __name__ == "__main__":
    main()
