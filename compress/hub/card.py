"""The model card (README.md) of an artifact, made from its manifest alone.

Hubs read the YAML front matter: `base_model` and `base_model_relation` link the
artifact to its source, `license` must be the source's (a compressed model is a
derivative), and tags such as `4-bit`, `awq`, `compressed-tensors` are what people filter
quantized models by. The body carries the measured drift, the recipe and the exact
command, so the card says what the artifact costs in quality and how to remake it.
"""

from __future__ import annotations

import json

from compress.artifact.formats import DEFAULT, codec
from compress.calib_data.sources import data_name
from compress.eval.drift import computed_by
from compress.methods import STAGES


def card_tags(m: dict) -> list[str]:
    """Hub tags: the layout, each stage's own, and every weight bit width the artifact's
    config groups declare (the manifest's `weights.bits`: an 8-bit lm_head or the 8-bit
    linears mixed precision chose are tagged, not only the recipe's scheme)."""
    tags = ["llmpress", codec(m["recipe"].get("export") or DEFAULT).hub_tag]
    planned = set()  # manifests written before `weights.bits`: the stages' own settings
    for stage in m["recipe"]["stages"]:
        for name, settings in stage.items():
            entry = STAGES.get(name)
            if entry is None:  # a stage this version does not know: its name as the tag
                tags.append(name)
                continue
            tags += entry.factory.tags
            planned.add(entry.factory.weight_bits(settings))
    stored = m["weights"].get("bits")
    bits = set(stored) if stored is not None else planned - {None}
    if bits:
        tags += ["quantized", *[f"{b}-bit" for b in sorted(bits)]]
    if m["recipe"].get("kv_cache") not in (None, "none"):
        tags.append("kv-cache-quantization")
    return list(dict.fromkeys(tags))


def relation(m: dict) -> str | None:
    """The hub's base_model_relation (one of adapter, merge, quantized, finetune; the
    field is optional), or None where none of them is true.

    The block stages (awq, gptq, tune...) and a distillation after them only fit the
    quantization to the original's own outputs: the weights are still the base model's,
    quantized. Whole-model stages before them changed the model first: a pruned model
    trained afterwards (a distill stage, which trains weights) is a finetune of the base;
    a pruned model not trained is neither a quantization of the base (its shape differs)
    nor a finetune (nothing was trained), so the card names only `base_model`.
    """
    names = [name for stage in m["recipe"]["stages"] for name in stage]
    factories = [STAGES[n].factory for n in names if n in STAGES]
    walk = next((k for k, f in enumerate(factories) if not f.whole_model), len(factories))
    before = [f for f in factories[:walk] if f.changes_model]
    if not before:
        return "quantized"
    # a stage that can repair a quantized model trains weights (distill)
    return "finetune" if any(f.repairs_quantized for f in before) else None


def read_as(src: dict) -> str | None:
    """What the artifact is of its source where it is not the source's own model: the
    text part of a multimodal checkpoint, another family's model under names of its own,
    or FP8 weights dequantized (the manifest's source record)."""
    family = f"`{src.get('model_type')}`"
    notes = []
    if src.get("text_part_of"):
        notes.append(f"the language model of a `{src['text_part_of']}`, as {family}")
    if src.get("renamed_from"):
        notes.append(f"a `{src['renamed_from']}` checkpoint, as {family} (its model)")
    if src.get("dequantized_from"):
        notes.append(f"its {src['dequantized_from'].upper()} weights, dequantized first")
    return "; ".join(notes) or None


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
        *([f"base_model_relation: {relation(m)}"] if relation(m) else []),
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
        *([f"| read as | {read_as(src)} |"] if read_as(src) else []),
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
    code = codec(m["recipe"].get("export") or DEFAULT).transformers_code(path, hf, route)
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
    "served": ("as served by llmpress", "int8 activations"),
    "exact": ("weights only", "fp32 activations"),
    "transformers": ("transformers", None),
}


def _drift_rows(drift: dict) -> list[str]:
    """One row per figure eval measured: as served, and the weights alone beside it."""
    rows = [(drift.get("kernels") or "exact", drift)]
    if drift.get("weights_only"):
        rows.append(("exact", {**drift, **drift["weights_only"]}))
    return [
        f"| {computed_by(k, d.get('kv_cache', ''), _COMPUTED)} | {d['ppl']:.3f} | "
        f"{d['base_ppl']:.3f} | {d['kl']:.5f} | {d['top1']:.4f} |"
        for k, d in rows
    ]
