"""llmpress's cache folder: converted checkpoints, eval references, calibration text and
remembered hashes live under it."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from compress.errors import LlmpressError


def cache_dir() -> Path:
    """Where converted checkpoints live: $LLMPRESS_CACHE, else ~/.cache/llmpress."""
    root = Path(os.environ.get("LLMPRESS_CACHE") or Path.home() / ".cache" / "llmpress")
    if root.exists() and not root.is_dir():
        where = "LLMPRESS_CACHE" if os.environ.get("LLMPRESS_CACHE") else "the cache folder"
        raise LlmpressError(
            f"{where} {root} is a file, not a folder: point LLMPRESS_CACHE at a folder "
            "(or unset it to use ~/.cache/llmpress)"
        )
    return root


def keep(store: Path, write: Callable) -> None:
    """Put an entry at `store` in the cache: write(binary file) into a temporary file
    beside it, then rename, so a reader never sees half an entry. A cache that cannot be
    written is only slower (the entry is computed again next time)."""
    try:
        store.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=store.parent, prefix=".tmp-")
    except OSError:
        return
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, store)
    except OSError:
        Path(tmp).unlink(missing_ok=True)
