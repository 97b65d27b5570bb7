"""manifest.json (how the artifact was made, exactly) and the README.md model card made from it."""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import json
import os
import platform
from pathlib import Path

from compress.stage import Workspace

MANIFEST = "manifest.json"
CARD = "README.md"
_PACKAGES = ("llmpress", "torch", "transformers", "safetensors", "compressed-tensors", "gguf")


def package_versions() -> dict[str, str | None]:
    versions = {}
    for name in _PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def weight_stats(ws: Workspace) -> dict:
    """Parameter counts and the stored bits per weight of the quantized linears."""
    params = 0
    for shape in (info[1] for info in ws.store.ckpt.tensors.values()):
        count = 1
        for dim in shape:
            count *= dim
        params += count
    qparams = sum(qw.q.numel() for qw in ws.quantized.values())
    qbits = 0
    for qw in ws.quantized.values():
        qbits += qw.q.numel() * qw.scheme.bits + qw.scale.numel() * qw.scale.element_size() * 8
        if qw.zero_point is not None:
            qbits += qw.zero_point.numel() * qw.scheme.bits
    return {
        "parameters": params,
        "quantized_parameters": qparams,
        "bits_per_quantized_weight": round(qbits / qparams, 4) if qparams else None,
    }


def folder_sizes(folder: Path) -> dict:
    files = {
        p.name: p.stat().st_size
        for p in sorted(folder.iterdir())
        if p.is_file() and p.name not in (MANIFEST, CARD)
    }
    weights = sum(v for k, v in files.items() if k.endswith(".safetensors"))
    return {"weights_bytes": weights, "files": files}


def build_manifest(
    *,
    ws: Workspace,
    source: dict,
    recipe: dict,
    stages: list[dict],
    folder: Path,
    seconds: float,
    command: str | None,
) -> dict:
    return {
        "llmpress_manifest": 1,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "source": source,
        "recipe": recipe,
        "stages": stages,
        "weights": weight_stats(ws),
        "sizes": folder_sizes(folder),
        "compress_seconds": round(seconds, 2),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "packages": package_versions(),
        "drift": None,
    }


def read_manifest(folder: Path) -> dict | None:
    path = Path(folder) / MANIFEST
    return json.loads(path.read_text()) if path.is_file() else None


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_manifest(folder: Path, manifest: dict) -> None:
    """Write manifest.json and regenerate the model card from it."""
    _atomic_write(Path(folder) / MANIFEST, json.dumps(manifest, indent=2) + "\n")
    _atomic_write(Path(folder) / CARD, model_card(manifest))


def model_card(m: dict) -> str:
    src = m["source"]
    w = m["weights"]
    recipe_yaml = json.dumps(m["recipe"], indent=2)
    mb = m["sizes"]["weights_bytes"] / 1e6
    lines = [
        "---",
        "library_name: transformers",
        "tags: [llmpress, compressed-tensors, quantized]",
        f"base_model: {src.get('name') or src['source']}",
        "---",
        f"# {src.get('name') or src['source']} — compressed with llmpress",
        "",
        f"Made with `{m.get('command') or 'llmpress compress'}` "
        f"(llmpress {m['packages'].get('llmpress')}).",
        "",
        "| | |",
        "|---|---|",
        f"| source | `{src['source']}` (sha256 `{src['sha256'][:16]}…`) |",
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
            f"Measured by `llmpress eval` on {drift['data']} ({drift['windows']} windows of "
            f"{drift['ctx']} tokens, {drift['tokens']:,} scored tokens).",
            "",
            "| perplexity | original perplexity | KL(original‖this) | top-1 agreement |",
            "|---|---|---|---|",
            f"| {drift['ppl']:.3f} | {drift['base_ppl']:.3f} | {drift['kl']:.5f} | "
            f"{drift['top1']:.4f} |",
            "",
        ]
    lines += ["## Loading", "", "```python", *_loading_snippet(m["recipe"]), "```", ""]
    lines += [
        "## Recipe",
        "",
        "```json",
        recipe_yaml,
        "```",
        "",
    ]
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
