"""Write safetensors files without holding their tensors: merged from parts, or made
one tensor at a time.

A safetensors file is an 8-byte little-endian header length, a JSON header (name →
dtype, shape, byte offsets into the data section) and the data. Knowing every tensor's
dtype and shape, the header can be written first and each tensor's bytes appended after
it: copied from a part file in chunks (`merge`), or produced by a function when its turn
comes (`write_produced`: a GGUF dequantized tensor by tensor, random weights). Either way
memory is one tensor (or a few MB), whatever the model's size.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch

from compress.model.safetensors_check import check_safetensors

_CHUNK = 16 << 20
# safetensors dtype -> bytes per element (the float8 ones: FP8 checkpoints, fp8_source.py)
DTYPES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
          "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}  # fmt: skip


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


def _header(specs: list[tuple[str, str, list[int], int]]) -> bytes:
    """The length-prefixed header for (name, dtype, shape, nbytes) in order."""
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dtype, shape, size in specs:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # keep the data section 8-byte aligned
    return struct.pack("<Q", len(raw)) + raw


def _write(dest: Path, entries: list[tuple[str, dict, Path, int]], copied=None) -> None:
    """Write `entries` to `dest`; copied(entry), if given, runs after each one's bytes."""
    specs = [
        (name, info["dtype"], info["shape"], info["data_offsets"][1] - info["data_offsets"][0])
        for name, info, _, _ in entries
    ]
    with open(dest, "wb") as out:
        out.write(_header(specs))
        for entry in entries:
            _, info, part, data_start = entry
            begin, end = info["data_offsets"]
            with open(part, "rb") as src:
                src.seek(data_start + begin)
                left = end - begin
                while left:
                    chunk = src.read(min(left, _CHUNK))
                    out.write(chunk)
                    left -= len(chunk)
            if copied is not None:
                copied(entry)


def _shards(sizes: list[int], shard_bytes: int) -> list[list[int]]:
    """Indices of consecutive entries per shard, each at most `shard_bytes` (or one entry)."""
    shards: list[list[int]] = [[]]
    size = 0
    for i, nbytes in enumerate(sizes):
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(i)
        size += nbytes
    return shards


def _write_shards(folder: Path, names: list[str], sizes: list[int], shard_bytes: int, write):
    """model.safetensors, or shards plus model.safetensors.index.json; write(path, indices)
    writes one file."""
    shards = _shards(sizes, shard_bytes)
    if len(shards) == 1:
        write(folder / "model.safetensors", shards[0])
        return [folder / "model.safetensors"]
    files, weight_map = [], {}
    for i, shard in enumerate(shards, 1):
        fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        write(folder / fname, shard)
        files.append(folder / fname)
        weight_map.update({names[j]: fname for j in shard})
    index = {"metadata": {"total_size": sum(sizes)}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return files


def merge(parts: list[Path], folder: Path, shard_bytes: int, consume: bool = False) -> list[Path]:
    """Write the tensors of `parts` as model.safetensors, or as shards with an index.

    consume: delete each part once its last tensor is copied, so the disk holds the
    artifact plus one part at most, not the artifact twice."""
    entries = _entries(parts)
    sizes = [e[1]["data_offsets"][1] - e[1]["data_offsets"][0] for e in entries]
    names = [e[0] for e in entries]
    last = {e[2]: e[0] for e in entries}  # each part's last tensor, in copy order

    def copied(entry) -> None:
        if consume and last[entry[2]] == entry[0]:
            entry[2].unlink()

    return _write_shards(
        folder,
        names,
        sizes,
        shard_bytes,
        lambda path, idx: _write(path, [entries[i] for i in idx], copied),
    )


def write_produced(
    folder: Path, specs: list[tuple[str, str, list[int]]], produce, shard_bytes: int
) -> list[Path]:
    """Write tensors (name, safetensors dtype, shape) in order, sharded like `merge`:
    produce(name) returns each one's contiguous CPU tensor when its turn comes."""
    sized = [(n, d, list(s), DTYPES[d] * _numel(s)) for n, d, s in specs]

    def write(path: Path, idx: list[int]) -> None:
        with open(path, "wb") as out:
            out.write(_header([sized[i] for i in idx]))
            for i in idx:
                name, _, shape, size = sized[i]
                t = produce(name)
                if list(t.shape) != shape or t.element_size() * t.numel() != size:
                    got = f"{list(t.shape)} {t.dtype}"
                    raise ValueError(f"{name}: produced {got}, expected {shape}")
                out.write(memoryview(t.contiguous().view(-1).view(torch.uint8).numpy()))

    return _write_shards(folder, [s[0] for s in sized], [s[3] for s in sized], shard_bytes, write)


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n
