"""The sha256 of every file an artifact holds, recorded in its manifest and checked on load.

A truncated download or a file changed after the fact must fail loudly, naming the
file, before anything computes with it. manifest.json itself and README.md (the card,
which `eval` regenerates when it records drift) are the two files not covered. Loading
reads a large file's hash from model/known_hash.py while its size, modification time and
inode are those it was hashed with (a 7B artifact is 5 GB to read on every load);
`verify` and `push` read every byte.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from compress.errors import LlmpressError

MANIFEST = "manifest.json"
UNHASHED = (MANIFEST, "README.md")
# files a loader (transformers, vLLM, llmpress) would read: unlisted, they change the model
_LOADED_SUFFIXES = (".safetensors", ".json", ".bin", ".pt", ".pth", ".gguf", ".model", ".jinja")
_LOADED_NAMES = ("merges.txt", "vocab.txt", "vocab.json")


def is_loaded_file(name: str) -> bool:
    """Whether a loader would read a file of this name from the artifact's folder (a weight
    shard, a config, tokenizer files, remote code)."""
    return (
        name.endswith((*_LOADED_SUFFIXES, ".py"))
        or name.startswith("tokenizer")
        or name in _LOADED_NAMES
    )


def user_entries(folder: Path, manifest: dict) -> list[Path]:
    """What a user added to an artifact (notes, folders): not written by llmpress, so
    never deleted by --overwrite."""
    recorded = manifest.get("sha256") if isinstance(manifest.get("sha256"), dict) else {}
    return [
        p
        for p in sorted(Path(folder).iterdir())
        if p.name not in recorded and p.name not in UNHASHED and not p.name.startswith(".")
    ]


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


def _plain_name(name: object) -> bool:
    """A file directly in the artifact's folder: no separators, no `..`, nothing absolute."""
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and "/" not in name
        and "\\" not in name
        and "\0" not in name
    )


def recorded_hashes(manifest: dict) -> tuple[dict[str, str], list[str]]:
    """(the manifest's {file: sha256}, one line per malformed entry): a manifest is input
    like any other, and must not make verify read outside the folder."""
    recorded = manifest.get("sha256")
    if not isinstance(recorded, dict):
        return {}, [f"{MANIFEST}: 'sha256' is not a table of file hashes (damaged)"]
    good, bad = {}, []
    for name, digest in recorded.items():
        if not _plain_name(name):
            bad.append(f"{MANIFEST}: lists {name!r}, which is not a file of this folder")
        elif not isinstance(digest, str) or len(digest) != 64:
            bad.append(f"{name}: its recorded sha256 is not a sha256 (damaged manifest)")
        else:
            good[name] = digest
    return good, bad


def problems(folder: Path, manifest: dict | None = None, sha256=file_sha256) -> list[str]:
    """What differs from the manifest's record: one line per missing, truncated, altered or
    unlisted file; [] when the folder is exactly what was written. `sha256(path)` hashes a
    file (every byte read by default)."""
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
    if not manifest.get("sha256"):
        return [f"{MANIFEST} lists no file hashes (made before llmpress recorded them)"]
    recorded, out = recorded_hashes(manifest)
    sizes = (manifest.get("sizes") or {}).get("files") or {}
    sizes = sizes if isinstance(sizes, dict) else {}
    for name, digest in recorded.items():
        path = folder / name
        if not path.is_file():
            out.append(f"{name}: missing (listed in {MANIFEST})")
            continue
        size, expected = path.stat().st_size, sizes.get(name)
        if isinstance(expected, int) and size != expected:
            out.append(f"{name}: truncated or grown ({size:,} bytes, {expected:,} recorded)")
        elif sha256(path) != digest:
            out.append(f"{name}: altered (sha256 differs from {MANIFEST})")
    present = {
        p.name for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")
    } - set(UNHASHED)
    out += [f"{name}: not listed in {MANIFEST}" for name in sorted(present - set(recorded))]
    return out


def check_artifact(folder: Path, sha256=file_sha256) -> None:
    """Refuse to load an artifact whose recorded files are missing, truncated or altered,
    or that holds an unlisted file a loader would read (a weight shard, a config): that
    would change the model behind the manifest's back. Other unlisted files (a user's
    notes) are allowed. `sha256`: as for problems (the loader passes the remembered one,
    model/known_hash.py)."""
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
    found = problems(folder, manifest, sha256)
    tail = f": not listed in {MANIFEST}"
    unlisted = [p.removesuffix(tail) for p in found if p.endswith(tail)]
    loaded = [name for name in unlisted if is_loaded_file(name)]
    if loaded:
        raise LlmpressError(
            f"artifact {folder} holds {loaded[0]}, which its {MANIFEST} does not list and a "
            "loader would read: remove it (or re-create the artifact)"
        )
    bad = [p for p in found if not p.endswith(tail)]
    if bad:
        raise LlmpressError(
            f"artifact {folder} is damaged: {bad[0]}; re-download or re-create it "
            f"(`llmpress verify {folder}` lists every file)"
        )
    _verified[key] = True
