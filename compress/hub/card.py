"""The model card (README.md) of an artifact, made from its manifest alone.

Hubs read the YAML front matter: `base_model` and `base_model_relation` link the
artifact to its source, `license` must be the source's (a compressed model is a
derivative), and tags such as `4-bit`, `awq`, `compressed-tensors` are what people filter
quantized models by. The body carries the measured drift, the recipe and the exact
command, so the card says what the artifact costs in quality and how to remake it.
"""

from __future__ import annotations

import json

from compress.calib_data.sources import data_name

_STAGE_TAGS = {
    "awq": ["awq"],
    "rtn": [],
    "int8": ["int8", "llm.int8"],
    "prune": ["pruned", "minitron"],
    "distill": ["distillation"],
}


def card_tags(m: dict) -> list[str]:
    tags = ["llmpress", "compressed-tensors"]
    bits = set()
    for stage in m["recipe"]["stages"]:
        for name, cfg in stage.items():
            tags += _STAGE_TAGS.get(name, [name])
            if name in ("awq", "rtn"):
                bits.add(cfg.get("bits"))
            if name == "int8":
                bits.add(8)
    if bits:
        tags += ["quantized", *[f"{b}-bit" for b in sorted(b for b in bits if b)]]
    if m["recipe"].get("kv_cache"):
        tags.append("kv-cache-quantization")
    return list(dict.fromkeys(tags))


def relation(m: dict) -> str:
    """The hub's base_model_relation: `quantized` when only quantization changed weights."""
    names = {name for stage in m["recipe"]["stages"] for name in stage}
    return "finetune" if names & {"prune", "distill"} else "quantized"


def model_card(m: dict) -> str:
    src = m["source"]
    w = m["weights"]
    base = src.get("name") or src["source"]
    license_ = src.get("license") or "other"
    mb = m["sizes"]["weights_bytes"] / 1e6
    front = [
        "---",
        "library_name: transformers",
        f"base_model: {base}",
        f"base_model_relation: {relation(m)}",
        f"license: {license_}",
        "pipeline_tag: text-generation",
        "tags:",
        *[f"- {t}" for t in card_tags(m)],
        "---",
    ]
    lines = [
        *front,
        f"# {base} — compressed with llmpress",
        "",
        f"Made from [{base}](https://huggingface.co/{base}) with llmpress "
        f"{m['packages'].get('llmpress')}:",
        "",
        "```",
        m.get("command") or "llmpress compress",
        "```",
        "",
        "| | |",
        "|---|---|",
        f"| source | `{src['source']}` (sha256 `{src['sha256'][:16]}…`) |",
        f"| source license | {src.get('license') or 'not found: check it before using this'} |",
        f"| recipe | {m.get('label', '')} |",
        f"| weights on disk | {mb:.1f} MB |",
        f"| parameters | {w['parameters']:,} ({w['quantized_parameters']:,} quantized) |",
        f"| bits per quantized weight | {w['bits_per_quantized_weight']} (scales included) |",
        f"| time to compress | {m['compress_seconds']} s |",
        "",
    ]
    drift = m.get("drift")
    if drift:
        lines += [
            "## Quality drift against the original",
            "",
            f"Measured by `llmpress eval` on {data_name(drift['data'])} "
            f"({drift['windows']} windows of "
            f"{drift['ctx']} tokens, {drift['tokens']:,} scored tokens).",
            "",
            "| perplexity | original perplexity | KL(original‖this) | top-1 agreement |",
            "|---|---|---|---|",
            f"| {drift['ppl']:.3f} | {drift['base_ppl']:.3f} | {drift['kl']:.5f} | "
            f"{drift['top1']:.4f} |",
            "",
        ]
    else:
        lines += ["Quality drift: not measured yet (`llmpress eval` records it here).", ""]
    lines += ["## Loading", "", "```python", *_loading_snippet(m["recipe"]), "```", ""]
    lines += ["## Recipe", "", "```json", json.dumps(m["recipe"], indent=2), "```", ""]
    return "\n".join(lines)


def _loading_snippet(recipe: dict) -> list[str]:
    """Asymmetric packed weights load only dequantized in transformers 5 (see docs/format.md)."""
    asym_packed = any(
        cfg.get("zero_point") and cfg.get("bits", 8) <= 4
        for stage in recipe["stages"]
        for cfg in stage.values()
    )
    if not asym_packed:
        return [
            "from transformers import AutoModelForCausalLM  # + pip install compressed-tensors",
            'model = AutoModelForCausalLM.from_pretrained("path/to/this/folder")',
        ]
    return [
        "from transformers import AutoModelForCausalLM, CompressedTensorsConfig",
        "model = AutoModelForCausalLM.from_pretrained(",
        '    "path/to/this/folder", quantization_config=CompressedTensorsConfig(dequantize=True)',
        ")",
    ]
