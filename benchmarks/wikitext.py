"""Where the benchmarks find WikiText-2 raw (beside the project root), and a loud stop
when it is missing: a benchmark never measures on something else silently."""

from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "wikitext-2-raw"


def require(data: Path, *names: str) -> None:
    for name in names or ("valid.txt", "test.txt"):
        if not (data / name).is_file():
            raise SystemExit(f"wikitext-2 not found: {data / name}")
