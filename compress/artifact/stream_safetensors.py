"""Merge safetensors files into (sharded) output files without loading the tensors.

A safetensors file is an 8-byte little-endian header length, a JSON header (name →
dtype, shape, byte offsets into the data section) and the data. Knowing every part's
header, the output header can be written first and each tensor's bytes then copied from
its part in chunks, so merging costs a few MB of memory whatever the model's size.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from compress.model.safetensors_check import check_safetensors

_CHUNK = 16 << 20


def _entries(parts: list[Path]) -> list[tuple[str, dict, Path, int]]:
    """(name, header entry, part file, offset of the part's data section) for every tensor."""
    out = []
    for part in parts:
        header = check_safetensors(part)
        with open(part, "rb") as f:
            (hlen,) = struct.unpack("<Q", f.read(8))
        for name, info in header.items():
            if name != "__metadata__":
                out.append((name, info, part, 8 + hlen))
    return out


def _write(dest: Path, entries: list[tuple[str, dict, Path, int]]) -> None:
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, info, _, _ in entries:
        size = info["data_offsets"][1] - info["data_offsets"][0]
        header[name] = {
            "dtype": info["dtype"],
            "shape": info["shape"],
            "data_offsets": [offset, offset + size],
        }
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # keep the data section 8-byte aligned
    with open(dest, "wb") as out:
        out.write(struct.pack("<Q", len(raw)))
        out.write(raw)
        for _, info, part, data_start in entries:
            begin, end = info["data_offsets"]
            with open(part, "rb") as src:
                src.seek(data_start + begin)
                left = end - begin
                while left:
                    chunk = src.read(min(left, _CHUNK))
                    out.write(chunk)
                    left -= len(chunk)


def merge(parts: list[Path], folder: Path, shard_bytes: int) -> list[Path]:
    """Write the tensors of `parts` as model.safetensors, or as shards with an index."""
    entries = _entries(parts)
    shards: list[list] = [[]]
    size = 0
    for entry in entries:
        nbytes = entry[1]["data_offsets"][1] - entry[1]["data_offsets"][0]
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(entry)
        size += nbytes
    if len(shards) == 1:
        _write(folder / "model.safetensors", shards[0])
        return [folder / "model.safetensors"]
    names, weight_map = [], {}
    for i, shard in enumerate(shards, 1):
        fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        _write(folder / fname, shard)
        names.append(folder / fname)
        weight_map.update({e[0]: fname for e in shard})
    total = sum(e[1]["data_offsets"][1] - e[1]["data_offsets"][0] for e in entries)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return names
