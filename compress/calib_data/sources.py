"""Text from a file (.txt, .jsonl, .parquet) or a dataset named on the Hugging Face Hub.

`self` (text the model writes itself) is handled in generated.py because it needs the
model; everything here needs only the source.
"""

from __future__ import annotations

import json
from pathlib import Path

from compress.errors import LlmpressError, first_line

TEXT_SUFFIXES = (".txt", ".text", ".md", ".raw")
SELF = "self"
FILE_SUFFIXES = (*TEXT_SUFFIXES, ".jsonl", ".json", ".parquet")


def data_name(source: str) -> str:
    """How reports and model cards name a text source: a file by its name, a hub
    dataset by its whole spec, `self` as what it is."""
    if source == SELF:
        return "self-generated text"
    path = Path(source)
    return path.name if path.suffix.lower() in FILE_SUFFIXES else source or "eval text"


def read_texts(source: str, text_field: str = "text") -> list[str]:
    """Documents from `source`: a file path, or `NAME[:CONFIG][:SPLIT]` of a hub dataset."""
    path = Path(source).expanduser()
    if path.is_file():
        return _read_file(path, text_field)
    if path.is_dir():
        raise LlmpressError(f"{source} is a folder: pass a .txt, .jsonl or .parquet file")
    if path.exists():  # a FIFO, socket or device: reading it could block or never end
        raise LlmpressError(
            f"{source} is not a regular file (a pipe, socket or device): save the text to "
            "a .txt, .jsonl or .parquet file and pass that"
        )
    if source.startswith((".", "/", "~")) or path.suffix in FILE_SUFFIXES:
        raise LlmpressError(f"no such text file: {source}")
    return _read_dataset(source, text_field)


def _read_file(path: Path, field: str) -> list[str]:
    suffix = path.suffix.lower()
    if suffix in TEXT_SUFFIXES:
        texts = [_text(path)]
    elif suffix in (".jsonl", ".json"):
        texts = []
        for n, line in enumerate(_text(path).splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise LlmpressError(f"{path}:{n} is not a JSON line ({e.msg})") from e
            if not isinstance(row, dict) or not isinstance(row.get(field), str):
                raise LlmpressError(
                    f"{path}:{n} has no text field {field!r}: set it with --text-field"
                )
            texts.append(row[field])
    elif suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except Exception as e:  # pyarrow raises several kinds on a damaged file
            first = first_line(e, 120)
            raise LlmpressError(
                f"{path} is not a readable parquet file ({first}); re-export it"
            ) from None
        if field not in table.column_names:
            raise LlmpressError(
                f"{path} has no column {field!r} (columns: {', '.join(table.column_names)}); "
                "set it with --text-field"
            )
        texts = [t for t in table.column(field).to_pylist() if isinstance(t, str)]
    else:
        raise LlmpressError(f"{path}: unknown text format {suffix!r}; use .txt, .jsonl or .parquet")
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise LlmpressError(f"{path} holds no text")
    return texts


def _text(path: Path) -> str:
    """A text file's contents; binary data (NUL bytes, or mostly undecodable) is refused,
    since tokenizing it would silently calibrate or evaluate on noise."""
    raw = path.read_bytes()
    if b"\x00" in raw[: 1 << 20]:
        raise LlmpressError(f"{path} is binary, not text: pass a UTF-8 text file")
    text = raw.decode("utf-8", errors="replace")
    if text.count("\ufffd") > 0.01 * max(len(text), 1):
        raise LlmpressError(f"{path} is not UTF-8 text: convert it, or pass another file")
    return text


def _read_dataset(spec: str, field: str) -> list[str]:
    name, _, rest = spec.partition(":")
    config, _, split = rest.partition(":")
    from compress.model.loading import _hub_reachable

    if not _hub_reachable():
        raise LlmpressError(
            f"dataset {name!r} cannot be fetched offline: pass a .txt, .jsonl or .parquet file, "
            "or use `self` (text the model generates)"
        )
    import datasets

    try:
        ds = datasets.load_dataset(name, config or None, split=split or "train")
    except Exception as e:
        raise LlmpressError(f"cannot load dataset {spec!r}: {e}") from e
    if field not in ds.column_names:
        raise LlmpressError(f"dataset {spec!r} has no column {field!r}; set it with --text-field")
    return [t for t in ds[field] if isinstance(t, str) and t.strip()]
