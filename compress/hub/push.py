"""`push`: publish an artifact to the Hugging Face Hub, or show exactly what would go.

Refuses before uploading anything: an artifact whose files do not match their manifest
hashes, a malformed repo id, no network (at once, one line), no token.
"""

from __future__ import annotations

import re
from pathlib import Path

from compress.artifact.integrity import check_artifact, recorded_hashes
from compress.artifact.manifest import read_manifest
from compress.errors import LlmpressError
from compress.hub.card import model_card

# The Hub's rule for each half of ORG/NAME: ASCII letters, digits, `.`, `_` and `-`, at
# most 96 characters, starting and ending with a letter or digit, no `--` or `..`.
_PART = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?", re.ASCII)


def check_repo_id(repo: str) -> None:
    """Refuse, before any upload, a repo id the Hub would reject (a non-ASCII letter, a
    missing ORG, a name over 96 characters)."""
    parts = repo.split("/")
    if len(parts) != 2 or not all(
        _PART.fullmatch(p) and "--" not in p and ".." not in p for p in parts
    ):
        raise LlmpressError(
            f"--repo {repo!r} is not a hub id: write ORG/NAME, each of ASCII letters, digits, "
            "'.', '_' or '-' (at most 96, no '--' or '..'), e.g. me/model-w4"
        )


def plan(folder: Path, repo: str, private: bool) -> tuple[list[tuple[str, int, str]], str]:
    """The files to upload (name, bytes, sha256) and the model card, after every check."""
    folder = Path(folder)
    check_repo_id(repo)
    manifest = read_manifest(folder) if folder.is_dir() else None
    if manifest is None:
        raise LlmpressError(
            f"{folder} is not an llmpress artifact (no manifest.json): push what "
            "`llmpress compress` wrote"
        )
    check_artifact(folder)  # damaged, or an unlisted file a loader would read: refused
    hashes, _ = recorded_hashes(manifest)  # a user's own notes stay home
    if not hashes:
        raise LlmpressError(
            f"{folder}/manifest.json lists no file hashes: re-create the artifact with this "
            "llmpress; nothing was uploaded"
        )
    files = [(name, (folder / name).stat().st_size, digest) for name, digest in hashes.items()]
    files += [("manifest.json", (folder / "manifest.json").stat().st_size, "")]
    card = model_card(manifest)
    files.append(("README.md", len(card.encode()), ""))
    return sorted(files), card


def describe(repo: str, private: bool, files, card: str) -> str:
    total = sum(size for _, size, _ in files)
    lines = [
        f"would create {'private' if private else 'public'} model repo {repo} and upload "
        f"{len(files)} files ({total / 1e6:.1f} MB):"
    ]
    for name, size, digest in files:
        lines.append(f"  {name:<28} {size:>14,} B  {digest[:16] or '(regenerated)'}")
    lines += ["", "--- README.md (model card) ---", card]
    return "\n".join(lines)


def push(folder: Path, repo: str, *, private: bool = False, dry_run: bool = False, log=print):
    from compress.model.loading import _hub_reachable

    folder = Path(folder)
    files, card = plan(folder, repo, private)
    if dry_run:
        log(describe(repo, private, files, card))
        return None
    if not _hub_reachable():
        raise LlmpressError(
            "cannot reach the Hugging Face Hub (offline or HF_HUB_OFFLINE set): nothing was "
            "uploaded; `--dry-run` shows what would be"
        )
    from huggingface_hub import HfApi, get_token

    if not get_token():
        raise LlmpressError(
            "no Hugging Face token: run `hf auth login` or set HF_TOKEN; nothing was uploaded"
        )
    (folder / "README.md").write_text(card)
    api = HfApi()
    url = api.create_repo(repo, private=private, exist_ok=True, repo_type="model")
    api.upload_folder(
        folder_path=str(folder),
        repo_id=repo,
        commit_message=f"llmpress: {read_manifest(folder).get('label', 'artifact')}",
        ignore_patterns=[".*"],
    )
    log(f"pushed {len(files)} files to {url}")
    return url
