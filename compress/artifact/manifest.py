"""manifest.json (how the artifact was made, exactly) and the README.md model card made from it."""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import json
import os
import platform
import shlex
from pathlib import Path
from typing import Any

from compress.artifact.formats import PACKAGES, stored_bits
from compress.artifact.integrity import file_hashes
from compress.errors import LlmpressError
from compress.hub.card import model_card
from compress.stage import Workspace

MANIFEST = "manifest.json"
CARD = "README.md"
_PACKAGES = ("llmpress", "torch", "transformers", "safetensors", *PACKAGES, "gguf")


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


def _config(folder: Path) -> dict:
    return json.loads((Path(folder) / "config.json").read_text())


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
        # the bit widths config.json's groups declare: what the card's tags say
        "weights": {**weight_stats(ws), "bits": stored_bits(_config(folder))},
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


def portable_path(text: str) -> str:
    """A path as a file meant to be shared records it: relative to the working directory
    when it lies under it, else its name alone; never where it sits on this machine."""
    path = Path(os.path.abspath(os.path.expanduser(text)))
    here = Path.cwd()
    for p, base in ((path, here), (path.resolve(), here.resolve())):
        if p.is_relative_to(base):
            rel = str(p.relative_to(base))
            # `./a/b`, never `a/b`: that would read as a hub id (ORG/NAME) to `eval`
            return f"./{rel}" if "/" in rel else rel
    return path.name or text


def _is_machine_path(text: str) -> bool:
    return "\n" not in text and os.path.isabs(os.path.expanduser(text))


def portable_command(command: str) -> str:
    """A command line with every absolute path argument (`-o /x`, `--calib=/x`) made
    portable (portable_path)."""
    try:
        words = shlex.split(command)
    except ValueError:  # unbalanced quotes: words as typed
        words = command.split()
    out = []
    for word in words:
        flag, eq, value = word.partition("=")
        if eq and flag.startswith("-") and _is_machine_path(value):
            word = f"{flag}={portable_path(value)}"
        elif _is_machine_path(word):
            word = portable_path(word)
        out.append(word)
    return " ".join(shlex.quote(w) for w in out)


def portable(value: Any, key: str | None = None) -> Any:
    """`value` (a manifest, or any part of it) with every absolute path made portable: the
    source folder, the `--calib`, `--data` and `--base` files, the command line's `-o`
    and `--recipe`. A shared artifact should not say where it was made (user names,
    folder layout), and the relative form is what a reader in that folder can use."""
    if isinstance(value, dict):
        return {k: portable(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [portable(v) for v in value]
    if isinstance(value, str):
        if key == "command":
            return portable_command(value)
        if _is_machine_path(value):
            return portable_path(value)
    return value


def write_manifest(folder: Path, manifest: dict) -> None:
    """Write manifest.json and regenerate the model card from it, paths made portable
    relative to where the command runs (`compress`, or a later `eval`)."""
    manifest = portable(manifest)
    text = json.dumps(manifest, indent=2, allow_nan=False)  # strict JSON: never a NaN
    _atomic_write(Path(folder) / MANIFEST, text + "\n")
    _atomic_write(Path(folder) / CARD, model_card(manifest))
