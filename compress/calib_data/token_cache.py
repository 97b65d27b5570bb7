"""Token streams of text files, kept: a file is tokenized once per tokenizer.

Calibration draws windows from anywhere in its text, and evaluation's windows run from its
start, so both tokenize the whole file: a second for WikiText-2's 1.2 MB on 2 cores (most
of a tiny model's compress), minutes for a calibration set of a few hundred MB, on every
run. The stream is stored in llmpress's cache folder under the sha256 of the file's bytes,
the field read and the sha256 of the tokenizer's serialization with its end-of-sequence
id: the same inputs give the same tokens, so an entry is exact. A hub dataset named by id
is tokenized every time (its download is the datasets library's to keep).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from compress.calib_data.samples import token_stream
from compress.calib_data.sources import read_texts
from compress.model.cache_folder import cache_dir, keep
from compress.model.known_hash import known_sha256

VERSION = 1  # bump when what an entry holds changes
_MEMO_ENTRIES = 4
_memo: dict[str, torch.Tensor] = {}  # this process's last streams, int32


def source_stream(tokenizer, source: str, text_field: str = "text") -> torch.Tensor:
    """token_stream(tokenizer, read_texts(source, text_field)), from the cache when the
    same file was tokenized by the same tokenizer before."""
    path = Path(source).expanduser()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if not path.is_file() or backend is None:
        return token_stream(tokenizer, read_texts(source, text_field))
    key = _key(path, text_field, backend.to_str(), tokenizer.eos_token_id)
    stream = _memo.get(key)
    if stream is None:
        store = cache_dir() / "tokens" / f"{key}.pt"
        stream = _load(store)
        if stream is None:
            stream = token_stream(tokenizer, read_texts(source, text_field)).to(torch.int32)
            keep(store, lambda f: torch.save(stream, f))
        while len(_memo) >= _MEMO_ENTRIES:
            _memo.pop(next(iter(_memo)))
        _memo[key] = stream
    return stream.long()  # a copy: callers may write into what they get


def _key(path: Path, field: str, tokenizer_json: str, eos: int | None) -> str:
    h = hashlib.sha256(f"v{VERSION} {known_sha256(path)} {field!r} {eos} ".encode())
    h.update(hashlib.sha256(tokenizer_json.encode()).digest())
    return h.hexdigest()[:32]


def _load(store: Path) -> torch.Tensor | None:
    if not store.is_file():
        return None
    try:
        stream = torch.load(store, weights_only=True)
    except Exception:  # a damaged entry is tokenized again, never trusted
        return None
    ok = isinstance(stream, torch.Tensor) and stream.dtype == torch.int32 and stream.dim() == 1
    return stream if ok else None
