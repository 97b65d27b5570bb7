"""Check a safetensors file's header against its size before anything reads it.

The safetensors library reports a truncated or damaged file with a low-level message
(or not at all until a tensor is touched); this names the file and the fix instead.
"""

from __future__ import annotations

import itertools
import json
import struct
from pathlib import Path

from compress.errors import LlmpressError

_DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip

_MAX_HEADER = 100 * 1024 * 1024


def check_safetensors(path: Path) -> dict:
    """Return the header of `path`, or raise naming what is wrong with the file."""
    fix = "re-download or re-export it"
    size = path.stat().st_size
    if size < 8:
        raise LlmpressError(f"corrupt safetensors file {path}: only {size} bytes; {fix}")
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        if header_len > min(size - 8, _MAX_HEADER):
            raise LlmpressError(
                f"corrupt safetensors file {path}: header length {header_len} does not fit in "
                f"{size} bytes (truncated or not a safetensors file); {fix}"
            )
        raw = f.read(header_len)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise LlmpressError(
            f"corrupt safetensors file {path}: unreadable header ({e}); {fix}"
        ) from e
    if not isinstance(header, dict):
        raise LlmpressError(f"corrupt safetensors file {path}: header is not a table; {fix}")
    data_len = size - 8 - header_len
    spans = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, end = info["data_offsets"]
            count = 1
            for dim in info["shape"]:
                count *= dim
            nbytes = count * _DTYPE_BYTES[info["dtype"]]
        except (KeyError, TypeError, ValueError) as e:
            raise LlmpressError(
                f"corrupt safetensors file {path}: bad entry for tensor {name!r}; {fix}"
            ) from e
        if end > data_len:
            raise LlmpressError(
                f"truncated safetensors file {path}: tensor {name!r} ends at byte {end} but the "
                f"file holds {data_len} data bytes; {fix}"
            )
        if end - begin != nbytes or begin < 0:
            raise LlmpressError(
                f"corrupt safetensors file {path}: tensor {name!r} has {end - begin} bytes for "
                f"shape {info['shape']} {info['dtype']}; {fix}"
            )
        spans.append((begin, end, name))
    spans.sort()
    for (_, end, first), (begin, _, second) in itertools.pairwise(spans):
        if begin < end:
            raise LlmpressError(
                f"corrupt safetensors file {path}: tensors {first!r} and {second!r} overlap "
                f"in the data section; {fix}"
            )
    return header
