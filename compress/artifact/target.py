"""Where an artifact may be written, decided before any work, so that nothing the user
has is ever lost: only an llmpress artifact (or an empty folder) is replaced, never the
model being compressed, and the hidden temporary folders of killed runs are cleaned.

A run writes into `.NAME.partial-XXXX` beside the target (with its pid inside) and
renames it at the end; a previous artifact is moved to `.NAME.old-XXXX` for the moment
of the swap. A run killed with SIGKILL leaves those behind: the next run for the same
target removes the ones whose process is gone.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from pathlib import Path

from compress.errors import LlmpressError

MANIFEST = "manifest.json"
OWNER = ".llmpress-owner"  # inside a temporary folder: "pid host"
_GRACE_S = 600  # a temporary folder with no owner file is stale only after this long


def is_artifact(folder: Path) -> bool:
    """An llmpress artifact: a folder whose manifest.json llmpress wrote."""
    try:
        manifest = json.loads((Path(folder) / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and "llmpress_manifest" in manifest


def check_output(out: Path, overwrite: bool) -> None:
    """Refuse, before any work, a target that exists (without --overwrite), that is not an
    artifact (with it), or that is not a folder path at all."""
    if str(out).strip() in ("", "."):
        raise LlmpressError("-o is empty: name the folder to write the artifact to")
    out = Path(out)
    if out.exists() or out.is_symlink():
        if not overwrite:
            raise LlmpressError(
                f"output {out} already exists: choose another -o or pass --overwrite"
            )
        if not out.is_dir() or out.is_symlink():
            raise LlmpressError(
                f"output {out} is not a folder: --overwrite replaces only llmpress artifacts; "
                "choose another -o"
            )
        if any(out.iterdir()) and not is_artifact(out):
            raise LlmpressError(
                f"output {out} exists and is not an llmpress artifact (no llmpress "
                "manifest.json): --overwrite replaces only artifacts; choose another -o or "
                "empty that folder yourself"
            )
        if Path.cwd().resolve().is_relative_to(out.resolve()):
            raise LlmpressError(
                f"output {out} holds the current folder: run from elsewhere or choose another -o"
            )
    parent = existing_ancestor(out.parent)
    if not parent.is_dir():
        raise LlmpressError(f"cannot create {out}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK):
        raise LlmpressError(f"cannot write to {parent}: permission denied; choose another -o")


def check_not_source(out: Path, source: Path) -> None:
    """Refuse to write over (or around) the checkpoint being compressed."""
    out, source = Path(out).resolve(), Path(source).resolve()
    if source == out or source.is_relative_to(out):
        raise LlmpressError(
            f"output {out} is (or holds) the model being compressed ({source}): writing "
            "there would replace the source; choose another -o"
        )


def existing_ancestor(path: Path) -> Path:
    """`path` or its nearest ancestor that exists (where disk space can be measured)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def mark_owner(folder: Path) -> None:
    (Path(folder) / OWNER).write_text(f"{os.getpid()} {socket.gethostname()}\n")


def _owner_alive(folder: Path) -> bool:
    try:
        pid, host = (folder / OWNER).read_text().split()
    except (OSError, ValueError):
        return time.time() - folder.stat().st_mtime < _GRACE_S
    if host != socket.gethostname():
        return True  # another machine's run on a shared disk: not ours to judge
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError):
        return True
    return True


def clean_stale(out: Path, log=print) -> None:
    """Remove temporary folders that killed runs left beside `out`."""
    parent = Path(out).parent
    if not parent.is_dir():
        return
    for prefix in (f".{Path(out).name}.partial-", f".{Path(out).name}.old-"):
        for folder in parent.glob(prefix + "*"):
            if not folder.is_dir() or folder.is_symlink() or _owner_alive(folder):
                continue
            previous = folder / "artifact"  # killed mid-swap: the old artifact comes back
            if ".old-" in folder.name and previous.is_dir() and not Path(out).exists():
                os.replace(previous, out)
                log(f"restored {out} from {folder}, left by an interrupted run")
            shutil.rmtree(folder, ignore_errors=True)
            log(f"removed {folder}, left by an interrupted run")


def publish_permissions(folder: Path) -> None:
    """mkdtemp makes a private (0700) folder; give the finished one the usual umask modes."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for f in folder.iterdir():
        f.chmod(0o666 & ~umask)
