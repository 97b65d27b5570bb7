"""manifest.json (how the artifact was made, exactly) and the README.md model card made from it."""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import json
import os
import platform
from pathlib import Path

from compress.artifact.integrity import file_hashes
from compress.errors import LlmpressError
from compress.hub.card import model_card
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
        "sha256": file_hashes(folder),
        "compress_seconds": round(seconds, 2),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "packages": package_versions(),
        "drift": None,
    }


def read_manifest(folder: Path) -> dict | None:
    path = Path(folder) / MANIFEST
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        manifest = None
    if not isinstance(manifest, dict):
        raise LlmpressError(f"{path} is damaged (not a JSON object): re-create the artifact")
    return manifest


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_manifest(folder: Path, manifest: dict) -> None:
    """Write manifest.json and regenerate the model card from it."""
    text = json.dumps(manifest, indent=2, allow_nan=False)  # strict JSON: never a NaN
    _atomic_write(Path(folder) / MANIFEST, text + "\n")
    _atomic_write(Path(folder) / CARD, model_card(manifest))
