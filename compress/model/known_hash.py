"""The sha256 a checkpoint's files are known by, remembered per file by its stat.

A checkpoint is identified by the hash of its weights: eval keys the original's cached
figures by it and compares it with the one the artifact's manifest recorded, and a GGUF
is looked up in the conversion cache by it. Reading a 7B checkpoint's 15 GB to hash it
again on every run (twice in one eval) cost more than the evaluation it keyed. So a file's
hash is remembered, in this process and in llmpress's cache folder, by its resolved path,
size, modification time in nanoseconds, inode and device: the facts git's index trusts to
tell an unchanged file. A write changes the modification time, and so the key, except
within one tick of the file system's clock: a hash is only remembered for a file last
written more than RACY_NS before it was read (git's "racy clean" rule), so two writes of
the same size in quick succession are never mistaken for one. `llmpress verify` still
reads every byte (artifact/integrity.py).
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

from compress.artifact.integrity import file_sha256
from compress.model.cache_folder import cache_dir, keep

MIN_BYTES = 1 << 26  # smaller files are hashed again: cheap, and nothing left on disk
RACY_NS = 2_000_000_000  # a file written this recently may change within its mtime tick
_memo: dict[tuple, str] = {}


def _stat_key(path: Path) -> tuple:
    st = path.stat()
    return (str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev)


def _store(key: tuple) -> Path:
    name = hashlib.sha256(repr(key).encode()).hexdigest()[:40]
    return cache_dir() / "sha256" / name


def known_sha256(path: Path) -> str:
    """file_sha256(path), read from memory or the cache when the file is unchanged."""
    path = Path(path)
    key = _stat_key(path)
    if key in _memo:
        return _memo[key]
    if key[1] < MIN_BYTES:
        return file_sha256(path)
    store = _store(key)
    try:
        digest = store.read_text().strip()
    except OSError:
        digest = ""
    if len(digest) == 64 and all(c in "0123456789abcdef" for c in digest):
        _memo[key] = digest
        return digest
    started = time.time_ns()
    digest = file_sha256(path)
    if started - key[2] > RACY_NS:  # written well before it was read: the hash is settled
        keep(store, lambda f: f.write(digest.encode()))
        _memo[key] = digest
    return digest
