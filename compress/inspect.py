"""`inspect`: what an artifact holds, from its files alone."""

from __future__ import annotations

import json
from collections import Counter

from compress.artifact.formats import reading_codec
from compress.artifact.manifest import read_manifest
from compress.hub.card import read_as
from compress.methods import STAGES
from compress.model.loading import resolve


def describe(artifact: str, as_json: bool = False) -> str:
    ckpt = resolve(artifact)  # checks config, architecture and every safetensors header
    manifest = read_manifest(ckpt.path)
    if as_json:
        return json.dumps(manifest, indent=2)
    qc = ckpt.config.get("quantization_config")
    lines = [
        f"{ckpt.path}: {ckpt.config['model_type']}, {ckpt.num_layers} layers, "
        f"hidden {ckpt.config['hidden_size']}"
    ]
    codec = reading_codec(ckpt.config)
    lines += codec.describe(qc) if codec else ["format: dense (not quantized)"]
    sizes = Counter()
    for f in ckpt.files:
        sizes["weights"] += f.stat().st_size
    lines.append(f"weights on disk: {sizes['weights'] / 1e6:.1f} MB")
    if manifest:
        src = manifest["source"]
        w = manifest["weights"]
        lines.append(f"source: {src['source']} (sha256 {src['sha256'][:16]}…)")
        if note := read_as(src):
            lines.append(f"read as: {note}")
        lines.append(f"recipe: {manifest.get('label')}  made by: {manifest.get('command')}")
        lines.append(
            f"parameters: {w['parameters']:,}; bits per quantized weight: "
            f"{w['bits_per_quantized_weight']}"
        )
        for record in manifest.get("stages", []):
            entry = STAGES.get(record.get("stage"))
            line = entry.factory.summary(record) if entry else None
            if line:
                lines.append(line)
        d = manifest.get("drift")
        if d:
            lines.append(
                f"drift on {d['data']} ({d['windows']}×{d['ctx']}), "
                f"{d.get('kernels') or 'exact'}: ppl {d['ppl']:.3f} "
                f"(original {d['base_ppl']:.3f}), KL {d['kl']:.5f}, top-1 {d['top1']:.4f}"
            )
            if d.get("weights_only"):
                e = d["weights_only"]
                lines.append(
                    f"  weights only (exact): ppl {e['ppl']:.3f}, KL {e['kl']:.5f}, "
                    f"top-1 {e['top1']:.4f}"
                )
        else:
            lines.append("drift: not measured (run `llmpress eval`)")
    return "\n".join(lines)
