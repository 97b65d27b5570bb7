"""The model card (README.md) of an artifact, made from its manifest alone.

Hubs read the YAML front matter: `base_model` and `base_model_relation` link the
artifact to its source, `license` must be the source's (a compressed model is a
derivative), and tags such as `4-bit`, `awq`, `compressed-tensors` are what people filter
quantized models by. The body carries the measured drift, the recipe and the exact
command, so the card says what the artifact costs in quality and how to remake it.
"""

from __future__ import annotations

import json

from compress.artifact.codecs import codec
from compress.calib_data.sources import data_name
from compress.methods import STAGES


def card_tags(m: dict) -> list[str]:
    family = codec(m["recipe"].get("export") or "auto").family
    tags = ["llmpress", "awq" if family == "awq-gemm" else family]
    bits = set()
    for stage in m["recipe"]["stages"]:
        for name, settings in stage.items():
            entry = STAGES.get(name)
            if entry is None:  # a stage this version does not know: its name as the tag
                tags.append(name)
                continue
            tags += entry.factory.tags
            if entry.factory.weight_bits(settings) is not None:
                bits.add(entry.factory.weight_bits(settings))
    if bits:
        tags += ["quantized", *[f"{b}-bit" for b in sorted(b for b in bits if b)]]
    if m["recipe"].get("kv_cache"):
        tags.append("kv-cache-quantization")
    return list(dict.fromkeys(tags))


def relation(m: dict) -> str:
    """The hub's base_model_relation: `quantized` when only quantization changed weights."""
    names = {name for stage in m["recipe"]["stages"] for name in stage}
    changed = any(n in STAGES and STAGES[n].factory.changes_architecture for n in names)
    return "finetune" if changed else "quantized"


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
            "| computed | perplexity | original perplexity | KL(original‖this) | top-1 agreement |",
            "|---|---|---|---|---|",
            *_drift_rows(drift),
            "",
        ]
    else:
        lines += ["Quality drift: not measured yet (`llmpress eval` records it here).", ""]
    lines += ["## Loading", "", *_loading(m), ""]
    lines += ["## Recipe", "", "```json", json.dumps(m["recipe"], indent=2), "```", ""]
    return "\n".join(lines)


def _loading(m: dict) -> list[str]:
    """How each engine opens this artifact, from what the manifest recorded about it
    (compress/artifact/engines.py): the documented call, or why there is none."""
    engines = m.get("engines") or {"vllm": [], "transformers": []}
    path = '"path/to/this/folder"'
    hf = engines.get("transformers") or []
    route = m.get("transformers_kwargs", {}) if hf else {}
    if codec(m["recipe"].get("export") or "auto").family == "awq-gemm":
        code = [
            "# AutoAWQ's GEMM layout: transformers reads it through gptqmodel",
            "# pip install gptqmodel",
            "from transformers import AutoModelForCausalLM",
            f"model = AutoModelForCausalLM.from_pretrained({path})",
        ]
    elif not hf:
        code = [
            "from transformers import AutoModelForCausalLM  # + pip install compressed-tensors",
            f"model = AutoModelForCausalLM.from_pretrained({path})",
        ]
    elif route:
        code = [
            "# zero-point weights: transformers 5 loads them dequantized (docs/format.md)",
            "from transformers import AutoModelForCausalLM, CompressedTensorsConfig",
            "model = AutoModelForCausalLM.from_pretrained(",
            f"    {path}, quantization_config=CompressedTensorsConfig(dequantize=True)",
            ")",
        ]
    else:
        code = [f"# transformers cannot load this artifact: {hf[0]}"]
    vllm = engines.get("vllm") or []
    code += (
        ["", "# vLLM", f"# vllm serve {path[1:-1]}"]
        if not vllm
        else ["", f"# vLLM will not load this artifact: {'; '.join(vllm)}"]
    )
    if engines.get("vllm-cpu"):  # older manifests have no CPU verdict
        code += [f"# vLLM's CPU build will not run it: {'; '.join(engines['vllm-cpu'])}"]
    return ["```python", *code, "```", "", "llmpress runs it as is: `llmpress serve .`"]


_COMPUTED = {
    "served": "as served by llmpress (int8 activations)",
    "exact": "weights only (fp32 activations)",
    "transformers": "transformers",
}


def _drift_rows(drift: dict) -> list[str]:
    """One row per figure eval measured: as served, and the weights alone beside it."""
    rows = [(drift.get("kernels") or "exact", drift)]
    if drift.get("weights_only"):
        rows.append(("exact", {**drift, **drift["weights_only"]}))
    return [
        f"| {_COMPUTED.get(k, k)} | {d['ppl']:.3f} | {d['base_ppl']:.3f} | {d['kl']:.5f} | "
        f"{d['top1']:.4f} |"
        for k, d in rows
    ]
