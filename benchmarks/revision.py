"""Another revision's code beside this checkout, for benchmarks that run the two in turn."""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@contextmanager
def checkout(rev: str) -> Iterator[Path]:
    """A git worktree of `rev` (detached), removed afterwards."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "rev"
        add = ["git", "worktree", "add", "-q", "--detach", str(tree), rev]
        subprocess.run(add, cwd=ROOT, check=True)
        try:
            yield tree
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT)
