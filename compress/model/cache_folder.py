"""llmpress's cache folder: converted checkpoints, eval references, calibration text and
remembered hashes live under it."""

from __future__ import annotations

import os
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
