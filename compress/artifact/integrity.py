"""The sha256 of every file an artifact holds, recorded in its manifest and checked on load.

A truncated download or a file changed after the fact must fail loudly, naming the
file, before anything computes with it. manifest.json itself and README.md (the card,
which `eval` regenerates when it records drift) are the two files not covered.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from compress.errors import LlmpressError

MANIFEST = "manifest.json"
UNHASHED = (MANIFEST, "README.md")
_verified: dict[tuple, bool] = {}  # (folder, file stats) already checked in this process


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def file_hashes(folder: Path) -> dict[str, str]:
    """sha256 of every file in `folder` except the manifest and the card."""
    return {
        p.name: file_sha256(p)
        for p in sorted(Path(folder).iterdir())
        if p.is_file() and p.name not in UNHASHED and not p.name.startswith(".")
    }


def problems(folder: Path, manifest: dict | None = None) -> list[str]:
    """What differs from the manifest's record: one line per missing, truncated, altered or
    unlisted file; [] when the folder is exactly what was written."""
    folder = Path(folder)
    if manifest is None:
        path = folder / MANIFEST
        if not path.is_file():
            return [f"{folder} has no {MANIFEST}: nothing to verify against"]
        try:
            manifest = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError):
            return [f"{MANIFEST}: not valid JSON (damaged): re-download or re-create the artifact"]
        if not isinstance(manifest, dict):
            return [f"{MANIFEST}: not a JSON object (damaged): re-download or re-create it"]
    recorded = manifest.get("sha256")
    if not recorded:
        return [f"{MANIFEST} lists no file hashes (made before llmpress recorded them)"]
    sizes = manifest.get("sizes", {}).get("files", {})
    out = []
    for name, digest in recorded.items():
        path = folder / name
        if not path.is_file():
            out.append(f"{name}: missing (listed in {MANIFEST})")
            continue
        size, expected = path.stat().st_size, sizes.get(name)
        if expected is not None and size != expected:
            out.append(f"{name}: truncated or grown ({size:,} bytes, {expected:,} recorded)")
        elif file_sha256(path) != digest:
            out.append(f"{name}: altered (sha256 differs from {MANIFEST})")
    present = {
        p.name for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")
    } - set(UNHASHED)
    out += [f"{name}: not listed in {MANIFEST}" for name in sorted(present - set(recorded))]
    return out


def check_artifact(folder: Path) -> None:
    """Refuse to load an artifact whose recorded files are missing, truncated or altered
    (unlisted extra files are allowed: users add their own notes)."""
    folder = Path(folder)
    path = folder / MANIFEST
    if not path.is_file():
        return
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        raise LlmpressError(f"{path} is not valid JSON: the artifact is damaged") from None
    if not isinstance(manifest, dict):
        raise LlmpressError(f"{path} is not a JSON object: the artifact is damaged")
    if not manifest.get("sha256"):
        return
    key = (
        str(folder.resolve()),
        *((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.iterdir())),
    )
    if key in _verified:
        return
    bad = [p for p in problems(folder, manifest) if "not listed" not in p]
    if bad:
        raise LlmpressError(
            f"artifact {folder} is damaged: {bad[0]}; re-download or re-create it "
            f"(`llmpress verify {folder}` lists every file)"
        )
    _verified[key] = True
